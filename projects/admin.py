from django import forms
from django.contrib import admin

from kbportal.admin import OWNER_DB, OwnerDatabaseAdmin, OwnerDatabaseInline
from projects.models import ApiToken, Membership, Profile, Project, ProjectMember, Tenant
from projects.services import api_token_revoke


class MembershipInline(OwnerDatabaseInline):
    model = Membership


@admin.register(Tenant)
class TenantAdmin(OwnerDatabaseAdmin):
    list_display = ["name", "slug", "created_at"]
    search_fields = ["name", "slug"]
    inlines = [MembershipInline]


class ProjectMemberFormSet(forms.BaseInlineFormSet):
    """Each row's user must be a member of the project's tenant (named in the error)."""

    def clean(self):
        super().clean()
        tenant_id = self.instance.tenant_id
        members = set(
            Membership.all_tenants.using(OWNER_DB).filter(tenant_id=tenant_id).values_list("user_id", flat=True)
        )
        for form in self.forms:
            user = form.cleaned_data.get("user") if hasattr(form, "cleaned_data") else None
            if user is not None and not form.cleaned_data.get("DELETE") and user.pk not in members:
                raise forms.ValidationError(f"{user.get_username()} is not a member of this project's organization")


class ProjectMemberInline(OwnerDatabaseInline):
    """Who may read a project whose visibility is "Project members only" (viewer; editor may sync)."""

    model = ProjectMember
    formset = ProjectMemberFormSet
    fields = ["user", "role", "created_at"]
    readonly_fields = ["created_at"]


@admin.register(Project)
class ProjectAdmin(OwnerDatabaseAdmin):
    list_display = ["name", "slug", "tenant", "visibility", "created_at"]
    list_filter = ["tenant", "visibility"]
    search_fields = ["name", "slug"]
    inlines = [ProjectMemberInline]

    def save_formset(self, request, form, formset, change):
        if formset.model is not ProjectMember:
            return super().save_formset(request, form, formset, change)
        # Inline rows take the project's tenant and go through the owner's connection, like the parent.
        for member in formset.save(commit=False):
            member.tenant_id = form.instance.tenant_id
            member.save(using=self.using)
        for member in formset.deleted_objects:
            member.delete(using=self.using)


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

    list_display = [
        "name",
        "display_prefix",
        "tenant",
        "user",
        "project",
        "created_at",
        "expires_at",
        "revoked_at",
        "last_used_at",
    ]
    list_filter = ["tenant"]
    search_fields = ["name", "prefix", "user__username"]
    fields = (
        "tenant",
        "user",
        "name",
        "display_prefix",
        "project",
        "created_at",
        "expires_at",
        "revoked_at",
        "last_used_at",
    )
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
