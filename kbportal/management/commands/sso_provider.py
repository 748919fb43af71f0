"""``manage.py sso_provider add|list|remove``: a tenant's OpenID Connect identity providers.

    sso_provider add --tenant SLUG --name NAME --provider-id ID --server-url URL \\
        --client-id ID --secret SECRET|- --domain example.com [--domain ...] [--role member|admin] \\
        [--token-auth-method client_secret_basic|client_secret_post] [--logout-at-provider]
    sso_provider list --tenant SLUG
    sso_provider remove PROVIDER_ID

``--secret -`` reads the client secret from standard input (keeps it out of the shell history).
``add`` prints the redirect URI to register at the provider.
"""

from __future__ import annotations

import sys

from allauth.socialaccount.models import SocialApp
from django.apps import apps
from django.core.management.base import BaseCommand, CommandError
from django.urls import reverse

from kbportal.audit import audit_record
from kbportal.models import TenantIdentityProvider
from kbportal.sso import SsoConfigError, identity_provider_for_app, sso_provider_create
from kbportal.tenancy import tenant_context


def _tenant(slug: str):
    tenant = apps.get_model("projects", "Tenant").objects.filter(slug=slug).first()
    if tenant is None:
        raise CommandError(f"no tenant {slug!r} (manage.py demo or the admin creates tenants)")
    return tenant


class Command(BaseCommand):
    help = "Add, list or remove a tenant's OpenID Connect single sign-on providers."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        add = sub.add_parser("add", help="create an OpenID Connect app and bind it to a tenant")
        add.add_argument("--tenant", required=True, help="tenant slug")
        add.add_argument("--name", required=True, help="shown on the login page as 'Sign in with <name>'")
        add.add_argument("--provider-id", required=True, help="short id used in URLs, e.g. acme-okta")
        add.add_argument("--server-url", required=True, help="the issuer, e.g. https://acme.okta.com")
        add.add_argument("--client-id", required=True)
        add.add_argument("--secret", required=True, help="client secret, or - to read it from standard input")
        add.add_argument("--domain", action="append", required=True, help="email domain it admits (repeat for several)")
        add.add_argument("--role", default="member", help="role of a user on first login: member (default) or admin")
        add.add_argument("--token-auth-method", choices=["client_secret_basic", "client_secret_post"])
        add.add_argument(
            "--logout-at-provider", action="store_true", help="logging out also ends the session at the provider"
        )
        listing = sub.add_parser("list", help="list a tenant's providers")
        listing.add_argument("--tenant", required=True, help="tenant slug")
        remove = sub.add_parser("remove", help="delete a provider (its app and binding)")
        remove.add_argument("provider_id")

    def handle(self, *args, action, **options):
        try:
            getattr(self, f"_{action}")(**options)
        except SsoConfigError as exc:
            raise CommandError(str(exc)) from exc

    def _add(self, *, tenant, name, provider_id, server_url, client_id, secret, domain, role, **options):
        if secret == "-":
            secret = sys.stdin.readline().strip()
        tenant_row = _tenant(tenant)
        idp = sso_provider_create(
            tenant_id=tenant_row.pk,
            name=name,
            provider_id=provider_id,
            server_url=server_url,
            client_id=client_id,
            secret=secret,
            domains=domain,
            default_role=role,
            token_auth_method=options.get("token_auth_method"),
            logout_at_provider=options.get("logout_at_provider", False),
        )
        callback = reverse("openid_connect_callback", kwargs={"provider_id": provider_id})
        self.stdout.write(
            f"Added {name} ({provider_id}) for {tenant_row.slug}, domains {', '.join(idp.domains)}.\n"
            f"Register this redirect URI at the provider: <portal URL>{callback}"
        )

    def _list(self, *, tenant, **_):
        tenant_row = _tenant(tenant)
        with tenant_context(tenant_row.pk):
            rows = list(TenantIdentityProvider.objects.select_related("social_app").order_by("created_at"))
        if not rows:
            self.stdout.write(f"No identity providers for {tenant_row.slug}.")
        for row in rows:
            app = row.social_app
            state = "active" if row.is_active else "inactive"
            self.stdout.write(
                f"{app.provider_id}\t{app.name}\t{app.settings.get('server_url', '')}\t"
                f"{','.join(row.domains)}\t{row.default_role}\t{state}"
            )

    def _remove(self, *, provider_id, **_):
        app = SocialApp.objects.filter(provider="openid_connect", provider_id=provider_id).first()
        if app is None:
            raise CommandError(f"no OpenID Connect provider {provider_id!r}")
        idp = identity_provider_for_app(app.pk)
        if idp is None:
            app.delete()
        else:
            with tenant_context(idp.tenant_id):
                audit_record(
                    action="admin.change",
                    tenant_id=idp.tenant_id,
                    object_type=idp._meta.label_lower,
                    object_id=idp.pk,
                    data={"operation": "delete", "object": f"SSO provider {provider_id}", "via": "sso"},
                )
                app.delete()
        self.stdout.write(f"Removed {provider_id}.")
