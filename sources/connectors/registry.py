"""Maps a data-source kind to its connector class, by dotted path.

Built-in kinds are below; ``settings.KB_CUSTOM_CONNECTORS`` adds ``{"kind": "pkg.mod.Class"}``
for custom sources (a module whose class yields rows in the unified table's shape). Nothing
else in the stack changes when a kind is added.

``build_connector`` is also where a stored config becomes usable: secrets stored encrypted
(``enc:v1:...``, see ``kbportal.secrets``) are decrypted, and every configured URL is checked
against private and loopback networks (``kbportal.netcheck``) unless the source allows them.
"""

from __future__ import annotations

from typing import Any

import requests
from django.conf import settings
from django.utils.module_loading import import_string
from pydantic import SecretStr

from kbportal import netcheck
from kbportal.secrets import SecretsError, decrypt_fields
from sources.connectors.base import Connector, ConnectorError

BUILTIN_CONNECTORS: dict[str, str] = {
    "git": "sources.connectors.git.connector.GitConnector",
    "docs": "sources.connectors.docs.connector.DocsConnector",
    "slack_export": "sources.connectors.slack.export_connector.SlackExportConnector",
    "slack": "sources.connectors.slack.connector.SlackConnector",
    "jsonl": "sources.connectors.jsonl.connector.JsonDocumentsConnector",
    "github": "sources.connectors.github.connector.GitHubConnector",
    "jira": "sources.connectors.jira.connector.JiraConnector",
    "confluence": "sources.connectors.confluence.connector.ConfluenceConnector",
}


# Config fields that hold secrets whatever their type (a connector's ``SecretStr`` fields are added).
SECRET_FIELD_NAMES = frozenset(
    {"token", "app_token", "password", "api_token", "api_key", "webhook_secret", "client_secret", "secret"}
)
# Config fields holding a URL the connector connects to; ``path`` counts when it is a network URL.
URL_FIELD_NAMES = ("base_url", "server_url", "url", "path")
# Operator-only config flag (set in the admin): this source may reach private/loopback addresses.
ALLOW_PRIVATE_FIELD = "allow_private_network"


def connector_kinds() -> dict[str, str]:
    """All registered kinds -> dotted paths (built-ins first, then settings)."""
    return {**BUILTIN_CONNECTORS, **getattr(settings, "KB_CUSTOM_CONNECTORS", {})}


def get_connector_class(kind: str) -> type[Connector]:
    """The connector class for ``kind``. Raises ``ConnectorError`` for an unknown kind or a
    registered path that is not a :class:`Connector` subclass (its hooks have defaults there)."""
    kinds = connector_kinds()
    if kind not in kinds:
        raise ConnectorError(f"unknown data source kind {kind!r}; known kinds: {', '.join(sorted(kinds))}")
    cls = import_string(kinds[kind])
    if not (isinstance(cls, type) and issubclass(cls, Connector)):
        raise ConnectorError(
            f"data source kind {kind!r} maps to {kinds[kind]!r}, which is not a subclass of "
            "sources.connectors.base.Connector"
        )
    return cls


def secret_fields(kind: str) -> frozenset[str]:
    """Names of the config fields of ``kind`` that are stored encrypted: ``SECRET_FIELD_NAMES`` plus
    every field the connector's config model types as ``SecretStr``. An unknown kind gets the names."""
    try:
        model = get_connector_class(kind).config_model
    except (ConnectorError, ImportError, AttributeError):
        return SECRET_FIELD_NAMES
    # ``SecretStr`` or ``SecretStr | None``.
    typed = {name for name, field in model.model_fields.items() if SecretStr.__name__ in repr(field.annotation)}
    return SECRET_FIELD_NAMES | typed


def build_connector(
    kind: str, config: dict[str, Any], *, include=None, exclude=None, source_label: str | None = None
) -> Connector:
    """Instantiate the connector from a stored or submitted ``config``, validating it.

    Encrypted values are decrypted first; ``allow_private_network`` (bool, default false) is
    taken out of the config; unless it or ``settings.KB_ALLOW_PRIVATE_URLS`` is set, each URL
    field is resolved now and refused when it reaches a private, loopback, link-local,
    multicast or unspecified address, and a ``requests`` session the connector exposes as
    ``connector.client.session`` checks every address it connects to. Called both to validate
    (saving a source) and right before connecting (each run), so the check runs at both times.

    Raises ``ConnectorError`` naming the source (``source_label``, else the kind) and the field:
    an invalid field, a secret no configured key decrypts, or a refused URL with its address.
    """
    from pydantic import ValidationError

    label = source_label or f"a {kind!r} data source"
    cls = get_connector_class(kind)
    if not isinstance(config, dict):  # pydantic names the problem ("Input should be a valid dictionary")
        plain: Any = config
        allow_private = False
    else:
        try:
            plain = decrypt_fields(config, label=label)
        except SecretsError as exc:
            raise ConnectorError(str(exc)) from exc
        allow_private = plain.pop(ALLOW_PRIVATE_FIELD, False)
    if not isinstance(allow_private, bool):
        raise ConnectorError(f"invalid config for {label}: {ALLOW_PRIVATE_FIELD}: must be true or false")
    try:
        connector = cls(plain, include=include, exclude=exclude)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}" for err in exc.errors()
        )
        raise ConnectorError(f"invalid config for {label}: {problems}") from exc
    if not (allow_private or getattr(settings, "KB_ALLOW_PRIVATE_URLS", False)):
        for field in URL_FIELD_NAMES:
            value = plain.get(field) if isinstance(plain, dict) else None
            if isinstance(value, str) and value.strip():
                try:
                    netcheck.check_url(value, field=field)
                except netcheck.PrivateAddressError as exc:
                    raise ConnectorError(f"{label}: {exc}") from exc
        session = getattr(getattr(connector, "client", None), "session", None)
        if isinstance(session, requests.Session):
            netcheck.guard_session(session)
    return connector
