"""``manage.py api_token create|revoke|list``: API tokens for scripts, the API and MCP clients.

    api_token create --tenant SLUG --user USERNAME [--project SLUG] [--name NAME] [--expires-days N]
    api_token create --tenant SLUG --project SLUG --name NAME   (a service token: no user)
    api_token revoke PREFIX
    api_token list --tenant SLUG

``create`` prints the plain token once (on stdout, alone on its line); only its hash is stored.
"""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from kbportal.tenancy import tenant_context
from projects.models import Project, Tenant
from projects.selectors import ApiTokenRejected, api_token_get_for_operator, api_token_list_for_tenant
from projects.services import ApiTokenError, api_token_create, api_token_revoke


class Command(BaseCommand):
    help = "Create, revoke or list API tokens (used by the MCP server and the API)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a token and print it once")
        create.add_argument("--tenant", required=True, help="tenant slug")
        create.add_argument("--user", help="username (a member of the tenant); omit for a service token")
        create.add_argument("--project", help="pin the token to this project (default: the user's default project)")
        create.add_argument("--name", help="a label for the token (default: 'cli')")
        create.add_argument("--expires-days", type=int, help="expire after N days (default: never)")
        revoke = sub.add_parser("revoke", help="revoke a token by its prefix")
        revoke.add_argument("prefix", help="the token's prefix, as shown by list (kb_<prefix>_…)")
        listing = sub.add_parser("list", help="list a tenant's tokens (prefixes, never secrets)")
        listing.add_argument("--tenant", required=True, help="tenant slug")

    def handle(self, *args, action, **options):
        try:
            getattr(self, f"_{action}")(**options)
        except (ApiTokenError, ApiTokenRejected) as exc:
            raise CommandError(str(exc)) from exc

    def _create(self, *, tenant, user=None, project=None, name=None, expires_days=None, **_):
        tenant_row = _tenant(tenant)
        account = None
        if user:
            account = get_user_model().objects.filter(username=user).first()
            if account is None:
                raise CommandError(f"no user {user!r}")
        project_row = None
        if project:
            with tenant_context(tenant_row.pk):
                project_row = Project.objects.filter(slug=project).first()
            if project_row is None:
                raise CommandError(f"no project {project!r} in tenant {tenant!r}")
        token, raw = api_token_create(
            tenant=tenant_row, user=account, name=name or "cli", project=project_row, expires_in_days=expires_days
        )
        self.stderr.write(
            f"Created token kb_{token.prefix}_… ({token.name}) for {user or 'service'} in {tenant_row.slug}"
            f"{', project ' + project if project else ''}"
            f"{', expires ' + token.expires_at.isoformat() if token.expires_at else ''}. "
            "It is shown once; store it now:"
        )
        self.stdout.write(raw)

    def _revoke(self, *, prefix, **_):
        token = api_token_revoke(token=api_token_get_for_operator(prefix))
        self.stdout.write(f"revoked kb_{token.prefix}_… ({token.name}) at {token.revoked_at.isoformat()}")

    def _list(self, *, tenant, **_):
        tokens = api_token_list_for_tenant(tenant_id=_tenant(tenant).pk)
        if not tokens:
            self.stdout.write(f"no API tokens in {tenant}")
            return
        for t in tokens:
            expired = t.expires_at is not None and t.expires_at <= timezone.now()
            state = "revoked" if t.revoked_at else "expired" if expired else "active"
            self.stdout.write(
                "\t".join(
                    [
                        f"kb_{t.prefix}_…",
                        t.name,
                        t.user.get_username() if t.user else "(service)",
                        t.project.slug if t.project else "(default project)",
                        state,
                        f"created {t.created_at:%Y-%m-%d}",
                        f"expires {t.expires_at:%Y-%m-%d}" if t.expires_at else "no expiry",
                        f"last used {t.last_used_at:%Y-%m-%d %H:%M}" if t.last_used_at else "never used",
                    ]
                )
            )


def _tenant(slug: str) -> Tenant:
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise CommandError(f"no tenant {slug!r}")
    return tenant
