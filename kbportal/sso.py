"""Single sign-on: OpenID Connect identity providers per tenant, with just-in-time membership.

The protocol is django-allauth's (``allauth.socialaccount.providers.openid_connect``: discovery,
authorization code flow with PKCE, ID token and userinfo); this module only decides who may in.
A tenant's provider is an allauth ``SocialApp`` bound to the tenant by a
:class:`~kbportal.models.TenantIdentityProvider` row listing the email domains it admits.

:class:`TenantSocialAccountAdapter` (``SOCIALACCOUNT_ADAPTER``) checks every login through a
provider before anyone is logged in (:func:`sso_login_check`) and refuses, with a page saying why
and a ``login.refused`` audit event:

- a provider bound to no tenant, or an inactive binding (``provider_without_tenant``);
- no email (``email_missing``) or an email whose ``email_verified`` claim is not true
  (``email_unverified``);
- an email domain that is not one of the provider's tenant's domains (``domain_not_allowed``;
  the audit event's ``domain_tenant`` names the tenant that claims it, if any, the page does not);
- an email of an existing staff or superuser account (``operator_account``): a tenant's provider
  never takes over the operator's console;
- an email that the existing account it would be linked to only asserted itself (an unverified
  address added at ``/accounts/email/``, ``email_unclaimed``): whoever added it would get the
  provider's person, and the membership the login grants.

Nobody signs up at ``/accounts/signup/`` (:meth:`SsoAccountAdapter.is_open_for_signup`): accounts
come from operators, ``tenant_onboard`` and admitted SSO logins only.

An admitted login of a new person creates the user, a membership with the binding's
``default_role`` and their default project (the tenant's oldest project they may read), and
writes ``sso.join``. An existing user with that verified email is linked
(``SOCIALACCOUNT_EMAIL_AUTHENTICATION``; allauth then makes its password unusable unless that
email was verified here, since whoever set it may not own the address), and joins the tenant if
not yet a member. The
``login`` event itself comes from the auth signals (:mod:`kbportal.audit`), after the join, so
it carries the tenant.

Logout ends the portal session; for a provider whose app settings have ``logout_at_provider``,
:class:`SsoAccountAdapter` then sends the browser to the provider's ``end_session_endpoint``
(OpenID Connect RP-Initiated Logout 1.0) with ``client_id`` and ``post_logout_redirect_uri``.

Tenancy: the binding table has row-level security like every tenant-owned table; before the
tenant is known, lookups set ``app.sso_app_ids`` or ``app.sso_domain`` transaction-locally (see
migration ``0002_sso``). The base floor imports no app: the projects floor's services are named
by dotted path in :data:`PROJECT_SERVICES` and resolved on use.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import requests
from allauth.account.adapter import DefaultAccountAdapter
from allauth.account.internal.flows.login import AUTHENTICATION_METHODS_SESSION_KEY
from allauth.account.models import EmailAddress
from allauth.core.exceptions import ImmediateHttpResponse
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter
from allauth.socialaccount.models import SocialApp, SocialLogin
from allauth.socialaccount.providers.openid_connect.views import OpenIDConnectOAuth2Adapter
from django.db import connection, transaction
from django.http import HttpRequest
from django.shortcuts import render
from django.utils.http import urlencode
from django.utils.module_loading import import_string

from kbportal.audit import audit_record
from kbportal.models import TenantIdentityProvider
from kbportal.tenancy import tenant_context

OIDC_PROVIDER = "openid_connect"
logger = logging.getLogger(__name__)

# The projects floor's services a join uses (by dotted path, like kbportal/urls.py's includes).
PROJECT_SERVICES = {
    "membership_create": "projects.services.membership_create",
    "membership_list_for_user": "projects.selectors.membership_list_for_user",
    "project_list_for_user": "projects.selectors.project_list_for_user",
    "profile_set_default_project": "projects.services.profile_set_default_project",
}

_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_DOMAIN_RE = re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(?:\.{_LABEL})+")
_PROVIDER_ID_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,199}")

REFUSAL_MESSAGES = {
    "provider_without_tenant": "This sign-in provider is not connected to any organization on this portal.",
    "email_missing": "{provider} did not share an email address, so we cannot tell which organization you belong to.",
    "email_unverified": "{provider} has not verified your email address {email}. Verify it there, then sign in again.",
    "domain_not_allowed": "{domain} is not an email domain of the organization that {provider} signs in to. "
    "Sign in with your own organization's provider, or ask your administrator to add the domain.",
    "operator_account": "{email} belongs to an operator account of this portal, which signs in with its "
    "password, never through an organization's provider.",
    "email_unclaimed": "An account of this portal lists {email} without having verified it, so we cannot "
    "tell whose it is. Ask your administrator to remove the address from that account, then sign in again.",
}


def _service(name: str) -> Any:
    return import_string(PROJECT_SERVICES[name])


class SsoConfigError(ValueError):
    """An identity provider cannot be configured with these arguments (the message names which)."""


def sso_domains_parse(values: Iterable[str]) -> list[str]:
    """Lowercase, deduplicated email domains from ``values`` (each may hold several, separated by
    commas or spaces; a leading ``@`` is dropped). Raises :class:`SsoConfigError` naming a value
    that is not a DNS name with at least one dot, or when there is none at all."""
    domains: list[str] = []
    for value in values:
        for part in re.split(r"[\s,]+", str(value)):
            domain = part.strip().lower().removeprefix("@").rstrip(".")
            if not domain:
                continue
            if not _DOMAIN_RE.fullmatch(domain):
                raise SsoConfigError(f"domain {part!r} is not a DNS name such as example.com")
            if domain not in domains:
                domains.append(domain)
    if not domains:
        raise SsoConfigError("an identity provider needs at least one email domain")
    return domains


@contextmanager
def _lookup_setting(name: str, value: str) -> Iterator[None]:
    """Set the transaction-local ``app.<name>`` for the block (one transaction), then restore it."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT current_setting('app.{name}', true), set_config('app.{name}', %s, true)", [value])
            previous = cursor.fetchone()[0]
        yield
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT set_config('app.{name}', %s, true)", [previous or ""])


def identity_providers_for_apps(app_ids: Iterable[int]) -> dict[int, TenantIdentityProvider]:
    """``{social app id: its tenant binding}`` for the given allauth ``SocialApp`` ids; apps bound
    to no tenant are absent. Runs before any tenant is known (RLS admits exactly these rows)."""
    ids = sorted({int(i) for i in app_ids})
    if not ids:
        return {}
    with _lookup_setting("sso_app_ids", ",".join(map(str, ids))):
        rows = list(TenantIdentityProvider.all_tenants.filter(social_app_id__in=ids).select_related("tenant"))
    return {row.social_app_id: row for row in rows}


def identity_provider_for_app(app_id: int | None) -> TenantIdentityProvider | None:
    """The tenant binding of one ``SocialApp`` id, or ``None`` (unsaved app, or bound to no tenant)."""
    return identity_providers_for_apps([app_id]).get(int(app_id)) if app_id is not None else None


def tenant_ids_claiming_domain(domain: str) -> list[int]:
    """Ids of the tenants whose identity providers admit email ``domain`` (lowercase), sorted."""
    with _lookup_setting("sso_domain", domain.lower()):
        ids = TenantIdentityProvider.all_tenants.filter(domains__contains=[domain.lower()])
        return sorted(set(ids.values_list("tenant_id", flat=True)))


@dataclass(frozen=True)
class SsoDecision:
    """The outcome of :func:`sso_login_check`. ``reason`` is ``None`` when admitted, else one of
    the keys of :data:`REFUSAL_MESSAGES`; ``tenant_id`` is the provider's tenant (``None`` when it
    has none); ``domain_tenant_id`` the tenant claiming the email's domain when that is another."""

    provider_id: str
    provider_name: str
    email: str
    domain: str
    tenant_id: int | None
    reason: str | None
    identity_provider: TenantIdentityProvider | None = None
    domain_tenant_id: int | None = None

    @property
    def admitted(self) -> bool:
        return self.reason is None

    @property
    def message(self) -> str:
        """The refusal, in words for the person signing in ("" when admitted)."""
        if self.reason is None:
            return ""
        return REFUSAL_MESSAGES[self.reason].format(
            provider=self.provider_name, email=self.email, domain=self.domain or "(no domain)"
        )


def sso_login_check(*, app: SocialApp, email: str | None, email_verified: bool) -> SsoDecision:
    """May a person whose provider ``app`` asserts ``email`` (verified or not) sign in? Reads only."""
    email = (email or "").strip()
    domain = email.rpartition("@")[2].lower() if "@" in email else ""
    idp = identity_provider_for_app(app.pk)
    base = {"provider_id": app.provider_id or app.provider, "provider_name": app.name, "email": email, "domain": domain}
    if idp is None or not idp.is_active:
        return SsoDecision(**base, tenant_id=None, reason="provider_without_tenant")
    if not email or not domain:
        return SsoDecision(**base, tenant_id=idp.tenant_id, reason="email_missing", identity_provider=idp)
    if not email_verified:
        return SsoDecision(**base, tenant_id=idp.tenant_id, reason="email_unverified", identity_provider=idp)
    if domain not in idp.domains:
        others = [t for t in tenant_ids_claiming_domain(domain) if t != idp.tenant_id]
        return SsoDecision(
            **base,
            tenant_id=idp.tenant_id,
            reason="domain_not_allowed",
            identity_provider=idp,
            domain_tenant_id=others[0] if others else None,
        )
    return SsoDecision(**base, tenant_id=idp.tenant_id, reason=None, identity_provider=idp)


def sso_member_join(*, user: Any, decision: SsoDecision) -> bool:
    """Make ``user`` a member of the admitted decision's tenant (role: the binding's
    ``default_role``) unless they are one, and give them a default project when they have none:
    the oldest project of the tenant they may read. Returns ``True`` when a membership was
    created (then writes ``sso.join`` in the tenant's log). Raises ``ValueError`` for a refused
    decision."""
    if decision.reason is not None or decision.identity_provider is None or decision.tenant_id is None:
        raise ValueError(f"cannot join a refused sign-in ({decision.reason})")
    tenant_id = decision.tenant_id
    memberships = _service("membership_list_for_user")(user)
    joined = not any(m.tenant_id == tenant_id for m in memberships)
    if joined:
        role = decision.identity_provider.default_role
        membership = _service("membership_create")(tenant_id=tenant_id, user=user, role=role)
        audit_record(
            action="sso.join",
            tenant_id=tenant_id,
            actor=user,
            token_prefix=None,
            object_type=membership._meta.label_lower,
            object_id=membership.pk,
            data={"provider": decision.provider_id, "email": decision.email, "role": role},
        )
    profile = getattr(user, "kb_profile", None)
    if profile is not None:
        profile.refresh_from_db()
    if profile is None or profile.default_project_id is None:
        projects = [p for p in _service("project_list_for_user")(user) if p.tenant_id == tenant_id]
        if projects:
            first = min(projects, key=lambda p: (p.created_at, p.pk))
            _service("profile_set_default_project")(
                user=user, tenant_id=tenant_id, project_id=first.pk, chosen=False
            )  # given, not chosen: the first login still leads to onboarding
    return joined


def sso_provider_create(
    *,
    tenant_id: int,
    name: str,
    provider_id: str,
    server_url: str,
    client_id: str,
    secret: str,
    domains: Iterable[str],
    default_role: str = TenantIdentityProvider.Role.MEMBER,
    token_auth_method: str | None = None,
    logout_at_provider: bool = False,
) -> TenantIdentityProvider:
    """Create an OpenID Connect ``SocialApp`` and bind it to the tenant, in one transaction.

    ``provider_id`` (lowercase letters, digits, ``-``/``_``) is the provider's part of the portal
    URLs (``/accounts/oidc/<provider_id>/login/callback/`` is the redirect URI to register at the
    provider). ``server_url`` is the issuer (its ``/.well-known/openid-configuration`` is read
    at login). ``domains`` are parsed by :func:`sso_domains_parse`; a domain another tenant's
    provider admits is refused. ``token_auth_method`` is ``client_secret_basic`` or
    ``client_secret_post`` (``None``: chosen from the provider's metadata).
    ``logout_at_provider`` also ends the session at the provider on logout. Raises
    :class:`SsoConfigError` naming the bad argument. Writes an ``admin.change`` audit event.
    """
    name = (name or "").strip()
    if not name or len(name) > 40:
        raise SsoConfigError("name must be 1 to 40 characters (it is shown as 'Sign in with <name>')")
    if not _PROVIDER_ID_RE.fullmatch(provider_id or ""):
        raise SsoConfigError(f"provider id {provider_id!r} must be lowercase letters, digits, '-' or '_'")
    if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", server_url or ""):
        raise SsoConfigError(f"server URL {server_url!r} must be an http(s) URL such as https://idp.example.com")
    if not client_id or not secret:
        raise SsoConfigError("client id and secret are both required")
    if default_role not in TenantIdentityProvider.Role.values:
        raise SsoConfigError(f"role {default_role!r} must be one of {', '.join(TenantIdentityProvider.Role.values)}")
    if token_auth_method not in (None, "client_secret_basic", "client_secret_post"):
        raise SsoConfigError(f"token auth method {token_auth_method!r} must be client_secret_basic or _post")
    parsed = sso_domains_parse(domains)
    for domain in parsed:
        others = [t for t in tenant_ids_claiming_domain(domain) if t != tenant_id]
        if others:
            raise SsoConfigError(f"domain {domain!r} is already admitted by another organization's provider")
    settings: dict[str, Any] = {"server_url": server_url.rstrip("/")}
    if token_auth_method:
        settings["token_auth_method"] = token_auth_method
    if logout_at_provider:
        settings["logout_at_provider"] = True
    with transaction.atomic():
        if SocialApp.objects.filter(provider_id=provider_id).exists():
            raise SsoConfigError(f"provider id {provider_id!r} is already used")
        app = SocialApp.objects.create(
            provider=OIDC_PROVIDER,
            provider_id=provider_id,
            name=name,
            client_id=client_id,
            secret=secret,
            settings=settings,
        )
        with tenant_context(tenant_id):
            idp = TenantIdentityProvider.objects.create(
                tenant_id=tenant_id, social_app=app, domains=parsed, default_role=default_role
            )
            audit_record(
                action="admin.change",
                tenant_id=tenant_id,
                object_type=idp._meta.label_lower,
                object_id=idp.pk,
                data={"operation": "add", "object": f"SSO provider {provider_id}", "domains": parsed, "via": "sso"},
            )
    return idp


class TenantSocialAccountAdapter(DefaultSocialAccountAdapter):
    """django-allauth's social account adapter with the tenant checks of this module.

    - :meth:`list_providers` (the login page's buttons): only providers bound to an active tenant;
    - :meth:`pre_social_login`: refuses with a 403 page and ``login.refused`` (see the module
      docstring), joins an existing (linked) user to the tenant;
    - :meth:`save_user`: a new user joins the tenant right after being created;
    - :meth:`on_authentication_error`: a failed provider round trip is ``login.failed``.
    """

    def is_open_for_signup(self, request: HttpRequest, sociallogin: SocialLogin) -> bool:
        # A login reaching signup was admitted by pre_social_login; the account adapter closes
        # the password signup form only.
        return True

    def list_providers(self, request: HttpRequest) -> list:
        providers = super().list_providers(request)
        bound = identity_providers_for_apps(p.app.pk for p in providers if getattr(p, "app", None) and p.app.pk)
        return [p for p in providers if p.app is not None and p.app.pk in bound and bound[p.app.pk].is_active]

    def _decide(self, request: HttpRequest, sociallogin: SocialLogin) -> SsoDecision:
        """Check the login; a refusal is audited and raised as the refusal page (403)."""
        app = (sociallogin.provider or sociallogin.account.get_provider(request)).app
        addresses = sociallogin.email_addresses
        address = next((a for a in addresses if a.primary), None) or next(iter(addresses), None)
        decision = sso_login_check(
            app=app, email=address.email if address else None, email_verified=bool(address and address.verified)
        )
        user = sociallogin.user
        if decision.admitted and user is not None and user.pk is not None and (user.is_staff or user.is_superuser):
            decision = dataclasses.replace(decision, reason="operator_account")
        matched = getattr(sociallogin, "_did_authenticate_by_email", None)
        if decision.admitted and matched and user is not None and user.pk is not None:
            # Linked by email: only to an account that did not assert the address itself. An
            # operator-made account (User.email, no address row) or a verified address is trusted;
            # an unverified address row was typed in by the account's holder (signup, /accounts/email/).
            if EmailAddress.objects.filter(user=user, email__iexact=matched, verified=False).exists():
                decision = dataclasses.replace(decision, reason="email_unclaimed")
        if not decision.admitted:
            audit_record(
                action="login.refused",
                tenant_id=decision.tenant_id,
                actor=None,
                token_prefix=None,
                data={
                    "provider": decision.provider_id,
                    "email": decision.email,
                    "reason": decision.reason,
                    "domain": decision.domain,
                    "domain_tenant": decision.domain_tenant_id,
                    "uid": sociallogin.account.uid,
                },
            )
            response = render(request, "socialaccount/refused.html", {"decision": decision}, status=403)
            raise ImmediateHttpResponse(response)
        return decision

    def pre_social_login(self, request: HttpRequest, sociallogin: SocialLogin) -> None:
        decision = self._decide(request, sociallogin)
        sociallogin.kb_sso_decision = decision  # read by save_user for a new user
        if sociallogin.user is not None and sociallogin.user.pk is not None:
            sso_member_join(user=sociallogin.user, decision=decision)

    def save_user(self, request: HttpRequest, sociallogin: SocialLogin, form: Any = None) -> Any:
        # After a signup form the login was stored in the session without the decision: decide again.
        decision = getattr(sociallogin, "kb_sso_decision", None) or self._decide(request, sociallogin)
        user = super().save_user(request, sociallogin, form)
        sso_member_join(user=user, decision=decision)
        return user

    def on_authentication_error(self, request, provider, error=None, exception=None, extra_context=None) -> None:
        app = getattr(provider, "app", None)
        idp = identity_provider_for_app(app.pk) if app is not None and app.pk else None
        audit_record(
            action="login.failed",
            tenant_id=idp.tenant_id if idp is not None else None,
            actor=None,
            token_prefix=None,
            data={
                "provider": getattr(app, "provider_id", "") or getattr(provider, "id", ""),
                "error": str(error or ""),
                "exception": type(exception).__name__ if exception is not None else "",
            },
        )
        super().on_authentication_error(request, provider, error, exception, extra_context)


def sso_end_session_url(request: HttpRequest, *, after: str) -> str | None:
    """Where to send the browser to end its session at the identity provider it signed in with, or
    ``None`` (signed in otherwise, the app lacks ``logout_at_provider``, the provider publishes no
    ``end_session_endpoint``, or its discovery document cannot be read: logged, never raised).

    Read from the session's allauth authentication records, so call it before the logout. The
    provider returns the browser to ``after`` (made absolute; it must be registered there as a
    ``post_logout_redirect_uri``).
    """
    records = request.session.get(AUTHENTICATION_METHODS_SESSION_KEY) or []
    provider_id = next((r.get("provider") for r in reversed(records) if r.get("method") == "socialaccount"), None)
    if not provider_id:
        return None
    app = SocialApp.objects.filter(provider=OIDC_PROVIDER, provider_id=provider_id).first()
    if app is None or not app.settings.get("logout_at_provider"):
        return None
    try:
        endpoint = OpenIDConnectOAuth2Adapter(request, provider_id).openid_config.get("end_session_endpoint")
    except (requests.RequestException, ValueError) as exc:
        logger.warning("SSO logout: cannot read %s's discovery document: %s", provider_id, exc)
        return None
    if not endpoint:
        return None
    query = urlencode({"client_id": app.client_id, "post_logout_redirect_uri": request.build_absolute_uri(after)})
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"


_login_redirect: Callable[[Any, str], str | None] | None = None


def sso_register_login_redirect(resolver: Callable[[Any, str], str | None]) -> None:
    """Let a higher layer send a signed-in user elsewhere first: ``resolver(user, url)`` returns
    the address to go to instead of ``url`` (the default after login), or ``None``. The projects
    app registers onboarding here (a first login chooses a default project)."""
    global _login_redirect
    _login_redirect = resolver


class SsoAccountAdapter(DefaultAccountAdapter):
    """django-allauth's account adapter; after logging out of a session that signed in through a
    provider with ``logout_at_provider``, the browser goes on to the provider's logout
    (:func:`sso_end_session_url`)."""

    def is_open_for_signup(self, request: HttpRequest) -> bool:
        # No self-service accounts: a stranger's account holding someone's email would be linked
        # to that person's first SSO login (SOCIALACCOUNT_EMAIL_AUTHENTICATION).
        return False

    def get_login_redirect_url(self, request: HttpRequest) -> str:
        url = super().get_login_redirect_url(request)
        if _login_redirect is not None and request.user.is_authenticated:
            return _login_redirect(request.user, url) or url
        return url

    def get_signup_redirect_url(self, request: HttpRequest) -> str:
        # An SSO first login is a signup to allauth: it leads to onboarding as any first login does.
        url = super().get_signup_redirect_url(request)
        if _login_redirect is not None and request.user.is_authenticated:
            return _login_redirect(request.user, url) or url
        return url

    def get_logout_redirect_url(self, request: HttpRequest) -> str:
        url = super().get_logout_redirect_url(request)
        if not request.user.is_authenticated:
            return url
        return sso_end_session_url(request, after=url) or url
