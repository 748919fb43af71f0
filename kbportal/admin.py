"""Admin base for the platform operator: reads and writes through the table owner's connection.

The Django admin is the operator's console across tenants (staff users only), so it uses the
``owner`` alias, as Django's multiple-database admin recipe does. Tenant users never reach it.

Every add, change and delete made in the admin is also an audit event (:class:`AuditedAdminMixin`,
on :class:`OwnerDatabaseAdmin` and on Django's own user and group admins), and the audit log
itself is here, read-only (:class:`AuditEventAdmin`).
"""

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.models import ADDITION, CHANGE, DELETION
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group

from kbportal.audit import audit_record
from kbportal.models import AuditEvent, TenantIdentityProvider
from kbportal.sso import SsoConfigError, sso_domains_parse
from kbportal.tenancy import TenantOwned

OWNER_DB = "owner"
_OPERATIONS = {ADDITION: "add", CHANGE: "change", DELETION: "delete"}


def _tenant_model_label() -> str:
    model = TenantOwned._meta.get_field("tenant").remote_field.model
    return (model if isinstance(model, str) else model._meta.label).lower()


def _tenant_of(obj: Any) -> int | None:
    """The tenant an admin-edited row belongs to: its ``tenant_id``, the tenant itself, or none
    (a user or group: the operator's own business)."""
    if obj._meta.label_lower == _tenant_model_label():
        return obj.pk
    tenant_id = getattr(obj, "tenant_id", None)
    return tenant_id if isinstance(tenant_id, int) else None


class AuditedAdminMixin:
    """Writes an audit event next to each admin ``LogEntry``, in the same transaction.

    Overrides ``log_addition``, ``log_change`` and ``log_deletions`` (the hooks every admin
    add, change and delete goes through, bulk deletes included; a ``LogEntry`` post-save signal
    would miss bulk deletes, which Django writes with ``bulk_create``). The action is
    ``admin.change`` unless ``audit_actions`` maps the operation (``ADDITION``, ``CHANGE``,
    ``DELETION``) to a more specific one; ``data`` has ``operation`` (add, change, delete),
    ``object`` (its text) and ``message`` (Django's change message).
    """

    audit_actions: dict[int, str] = {}

    def _audit(self, request, obj, flag: int, message: Any) -> None:
        audit_record(
            action=self.audit_actions.get(flag, "admin.change"),
            tenant_id=_tenant_of(obj),
            actor=request.user,
            token_prefix=None,
            object_type=obj._meta.label_lower,
            object_id=obj.pk,
            data={"operation": _OPERATIONS[flag], "object": str(obj)[:200], "message": message, "via": "admin"},
        )

    def log_addition(self, request, obj, message):
        entry = super().log_addition(request, obj, message)
        self._audit(request, obj, ADDITION, message)
        return entry

    def log_change(self, request, obj, message):
        entry = super().log_change(request, obj, message)
        self._audit(request, obj, CHANGE, message)
        return entry

    def log_deletions(self, request, queryset):
        entries = super().log_deletions(request, queryset)
        for obj in queryset:
            self._audit(request, obj, DELETION, "")
        return entries


class OwnerDatabaseAdmin(AuditedAdminMixin, admin.ModelAdmin):
    using = OWNER_DB

    def get_queryset(self, request):
        manager = getattr(self.model, "all_tenants", self.model._default_manager)
        return manager.using(self.using).all()

    def save_model(self, request, obj, form, change):
        obj.save(using=self.using)

    def delete_model(self, request, obj):
        obj.delete(using=self.using)

    def delete_queryset(self, request, queryset):
        queryset.using(self.using).delete()

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        kwargs["queryset"] = _related_queryset(db_field, self.using)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        kwargs["queryset"] = _related_queryset(db_field, self.using)
        return super().formfield_for_manytomany(db_field, request, **kwargs)


class OwnerDatabaseInline(admin.TabularInline):
    using = OWNER_DB
    extra = 0

    def get_queryset(self, request):
        manager = getattr(self.model, "all_tenants", self.model._default_manager)
        return manager.using(self.using).all()

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        kwargs["queryset"] = _related_queryset(db_field, self.using)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


def _related_queryset(db_field, using):
    model = db_field.remote_field.model
    manager = getattr(model, "all_tenants", model._default_manager)
    return manager.using(using).all()


@admin.register(AuditEvent)
class AuditEventAdmin(OwnerDatabaseAdmin):
    """The audit log across tenants, read-only: nobody adds, edits or deletes an event here (the
    database refuses UPDATE and DELETE anyway). Events without a tenant show only here."""

    list_display = [
        "created_at",
        "action",
        "tenant_id",
        "actor_username",
        "actor_token_prefix",
        "object_type",
        "object_id",
        "ip",
        "request_id",
    ]
    list_filter = ["action"]
    search_fields = ["actor_username", "actor_token_prefix", "object_id", "request_id"]
    date_hierarchy = "created_at"
    readonly_fields = [f.name for f in AuditEvent._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


# Django's own user and group admins write audit events too (granting staff or superuser is
# the change an operator most needs to see later). kbportal comes after django.contrib.auth in
# INSTALLED_APPS, so autodiscovery has registered them by now.
for _model, _base in ((get_user_model(), UserAdmin), (Group, GroupAdmin)):
    if admin.site.is_registered(_model) and type(admin.site.get_model_admin(_model)) is _base:
        admin.site.unregister(_model)
        admin.site.register(_model, type(f"Audited{_base.__name__}", (AuditedAdminMixin, _base), {}))


class TenantIdentityProviderForm(forms.ModelForm):
    """Domains normalised by :func:`kbportal.sso.sso_domains_parse`; a domain another tenant's
    provider admits is refused (read through the owner's connection, across tenants)."""

    class Meta:
        model = TenantIdentityProvider
        fields = ["tenant", "social_app", "domains", "default_role", "is_active"]

    def clean_domains(self) -> list[str]:
        try:
            domains = sso_domains_parse(self.cleaned_data.get("domains") or [])
        except SsoConfigError as exc:
            raise forms.ValidationError(str(exc)) from exc
        tenant = self.cleaned_data.get("tenant")
        taken = TenantIdentityProvider.all_tenants.using(OWNER_DB).filter(domains__overlap=domains)
        if tenant is not None:
            taken = taken.exclude(tenant_id=tenant.pk)
        clash = sorted({d for row in taken for d in row.domains if d in domains})
        if clash:
            raise forms.ValidationError(f"already admitted by another organization's provider: {', '.join(clash)}")
        return domains


@admin.register(TenantIdentityProvider)
class TenantIdentityProviderAdmin(OwnerDatabaseAdmin):
    """Single sign-on: which OpenID Connect app (Social applications, provider "OpenID Connect",
    settings ``{"server_url": "https://idp.example.com"}``) signs in to which tenant, for which
    email domains, with which role on first login (see kbportal.sso)."""

    form = TenantIdentityProviderForm
    list_display = ["social_app", "tenant", "domain_list", "default_role", "is_active", "created_at"]
    list_filter = ["is_active", "default_role"]
    search_fields = ["social_app__name", "social_app__provider_id", "tenant__slug"]

    @admin.display(description="domains")
    def domain_list(self, obj: TenantIdentityProvider) -> str:
        return ", ".join(obj.domains)


# allauth's SocialApp admin through the owner's connection too: deleting an app cascades to its
# tenant binding, which row-level security would hide from the app role (and the delete fail).
def _register_social_app_admin() -> None:
    from allauth.socialaccount.admin import SocialAppAdmin
    from allauth.socialaccount.models import SocialApp

    if admin.site.is_registered(SocialApp) and type(admin.site.get_model_admin(SocialApp)) is SocialAppAdmin:
        admin.site.unregister(SocialApp)
        admin.site.register(SocialApp, type("OwnerSocialAppAdmin", (OwnerDatabaseAdmin, SocialAppAdmin), {}))


_register_social_app_admin()
