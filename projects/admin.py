from django.contrib import admin

from kbportal.admin import OwnerDatabaseAdmin, OwnerDatabaseInline
from projects.models import Membership, Profile, Project, Tenant


class MembershipInline(OwnerDatabaseInline):
    model = Membership


@admin.register(Tenant)
class TenantAdmin(OwnerDatabaseAdmin):
    list_display = ["name", "slug", "created_at"]
    search_fields = ["name", "slug"]
    inlines = [MembershipInline]


@admin.register(Project)
class ProjectAdmin(OwnerDatabaseAdmin):
    list_display = ["name", "slug", "tenant", "created_at"]
    list_filter = ["tenant"]
    search_fields = ["name", "slug"]


@admin.register(Membership)
class MembershipAdmin(OwnerDatabaseAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["tenant", "role"]


@admin.register(Profile)
class ProfileAdmin(OwnerDatabaseAdmin):
    list_display = ["user", "tenant", "default_project"]
