"""Who calls the API: a bearer API token (per user or per service) or a logged-in browser session.

``Authorization: Bearer kb_<prefix>_<secret>`` is checked on every request by
``projects.selectors.api_token_authenticate``; a refused token is HTTP 401 naming the reason
(``malformed``, ``unknown``, ``revoked``, ``expired``, ``not_member``). Without that header,
DRF's ``SessionAuthentication`` admits a logged-in user and enforces CSRF on unsafe methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from projects.selectors import ApiTokenRejected, TokenIdentity, api_token_authenticate, user_tenant_id
from projects.services import api_token_touch

BEARER = "bearer"


class TokenRefused(exceptions.AuthenticationFailed):
    """HTTP 401 for a presented but refused API token; ``reason`` is ``ApiTokenRejected.reason``."""

    def __init__(self, message: str, *, reason: str):
        super().__init__(f"API token refused ({reason}): {message}", code=reason)
        self.reason = reason


class ServiceTokenUser:
    """``request.user`` for a service token (one with no user): authenticated, nobody's account.

    It has no primary key, no permissions and no principals, so a service token never reads
    restricted rows and cannot act as a person (vote on answers).
    """

    pk = None
    id = None
    is_active = True
    is_authenticated = True
    is_anonymous = False
    is_staff = False
    is_superuser = False

    def __init__(self, identity: TokenIdentity):
        self.identity = identity
        self.username = f"service:kb_{identity.prefix}"

    def __str__(self) -> str:
        return self.username

    def get_username(self) -> str:
        return self.username

    def has_perm(self, perm: str, obj: Any = None) -> bool:
        return False


class ApiTokenAuthentication(BaseAuthentication):
    """DRF authentication by ``Authorization: Bearer kb_...``.

    Returns ``(user, TokenIdentity)``: the token's user, or a :class:`ServiceTokenUser` for a
    service token; ``None`` (next authenticator) when the header is absent or not a bearer one.
    Raises :class:`TokenRefused` (HTTP 401 with ``WWW-Authenticate: Bearer``) for a malformed,
    unknown, revoked or expired token or one whose user left the tenant. Records use with
    ``projects.services.api_token_touch`` (at most one write a minute per token).
    """

    def authenticate(self, request: Request) -> tuple[Any, TokenIdentity] | None:
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != BEARER.encode():
            return None
        if len(header) != 2:
            raise TokenRefused("the Authorization header must be 'Bearer kb_<prefix>_<secret>'", reason="malformed")
        try:
            raw = header[1].decode("ascii")
        except UnicodeError as exc:
            raise TokenRefused("the token holds characters that are not ASCII", reason="malformed") from exc
        try:
            identity = api_token_authenticate(raw)
        except ApiTokenRejected as exc:
            raise TokenRefused(str(exc), reason=exc.reason) from exc
        api_token_touch(identity=identity)
        return (identity.user if identity.user is not None else ServiceTokenUser(identity)), identity

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="kbportal"'


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """The bearer security scheme of :class:`ApiTokenAuthentication` in the OpenAPI schema."""

    target_class = ApiTokenAuthentication
    name = "bearerAuth"

    def get_security_definition(self, auto_schema) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "kb_<prefix>_<secret>",
            "description": "An API token from `manage.py api_token create` (per user, or a service token).",
        }


@dataclass(frozen=True)
class ApiCaller:
    """Who a request speaks for, in which tenant.

    ``identity`` is the API token's (``None`` for a browser session); ``user`` the person
    (``None`` for a service token); ``tenant_id`` the token's tenant or the session user's
    current one (``None`` when the user belongs to no organization yet).
    """

    tenant_id: int | None
    user: Any
    identity: TokenIdentity | None

    @property
    def user_id(self) -> int | None:
        return self.user.pk if self.user is not None else None


def api_caller(request: Request) -> ApiCaller:
    """The :class:`ApiCaller` of an authenticated DRF request (token first, else session)."""
    if isinstance(request.auth, TokenIdentity):
        return ApiCaller(tenant_id=request.auth.tenant_id, user=request.auth.user, identity=request.auth)
    return ApiCaller(tenant_id=user_tenant_id(request.user), user=request.user, identity=None)
