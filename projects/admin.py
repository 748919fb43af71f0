from django.contrib import admin

from kbportal.admin import OwnerDatabaseAdmin, OwnerDatabaseInline
from projects.models import ApiToken, Membership, Profile, Project, Tenant
from projects.services import api_token_revoke


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


@admin.register(ApiToken)
class ApiTokenAdmin(OwnerDatabaseAdmin):
    """Tokens are created with ``manage.py api_token create`` (the plain token is shown once);
    here the operator sees and revokes them. The stored hash is never displayed."""

    list_display = ["name", "display_prefix", "tenant", "user", "project", "created_at", "expires_at",
                    "revoked_at", "last_used_at"]  # fmt: skip
    list_filter = ["tenant"]
    search_fields = ["name", "prefix", "user__username"]
    fields = ["tenant", "user", "name", "display_prefix", "project", "created_at", "expires_at", "revoked_at",
              "last_used_at"]  # fmt: skip
    readonly_fields = fields
    actions = ["revoke"]

    @admin.display(description="token")
    def display_prefix(self, obj: ApiToken) -> str:
        return f"kb_{obj.prefix}_…"

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        tokens = list(queryset.using(self.using))
        for token in tokens:
            api_token_revoke(token=token)
        self.message_user(request, f"revoked {len(tokens)} token(s)")
