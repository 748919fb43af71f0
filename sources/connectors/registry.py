"""Maps a data-source kind to its connector class, by dotted path.

Built-in kinds are below; ``settings.KB_CUSTOM_CONNECTORS`` adds ``{"kind": "pkg.mod.Class"}``
for custom sources (a module whose class yields rows in the unified table's shape). Nothing
else in the stack changes when a kind is added.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from sources.connectors.base import Connector, ConnectorError

BUILTIN_CONNECTORS: dict[str, str] = {
    "git": "sources.connectors.git.connector.GitConnector",
    "docs": "sources.connectors.docs.connector.DocsConnector",
    "slack_export": "sources.connectors.slack_export.connector.SlackExportConnector",
    "slack": "sources.connectors.slack.connector.SlackConnector",
    "jsonl": "sources.connectors.jsonl.connector.JsonDocumentsConnector",
    "github": "sources.connectors.github.connector.GitHubConnector",
    "jira": "sources.connectors.jira.connector.JiraConnector",
    "confluence": "sources.connectors.confluence.connector.ConfluenceConnector",
}


def connector_kinds() -> dict[str, str]:
    """All registered kinds -> dotted paths (built-ins first, then settings)."""
    return {**BUILTIN_CONNECTORS, **getattr(settings, "KB_CUSTOM_CONNECTORS", {})}


def get_connector_class(kind: str) -> type[Connector]:
    """The connector class for ``kind``. Raises ``ConnectorError`` for an unknown kind."""
    kinds = connector_kinds()
    if kind not in kinds:
        raise ConnectorError(f"unknown data source kind {kind!r}; known kinds: {', '.join(sorted(kinds))}")
    return import_string(kinds[kind])


def build_connector(kind: str, config: dict[str, Any], *, include=None, exclude=None) -> Connector:
    """Instantiate the connector, validating ``config``.

    Raises ``ConnectorError`` naming the kind and each invalid field when validation fails.
    """
    from pydantic import ValidationError

    cls = get_connector_class(kind)
    try:
        return cls(config, include=include, exclude=exclude)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}" for err in exc.errors()
        )
        raise ConnectorError(f"invalid config for a {kind!r} data source: {problems}") from exc
