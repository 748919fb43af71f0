"""The tool registry (name -> callable returning evidence rows) and the scoped row loader tools share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection

from kbportal.tenancy import tenant_context
from search.pipeline.evidence import Evidence
from search.retrieval import HIT_COLUMNS, Hit, hit_from_row, scope_where_sql
from sources.selectors import QueryScope

ToolFn = Callable[..., list[Evidence]]

# Modules whose import registers tools; ``load_tools`` imports them all.
TOOL_MODULES = ("search.tools.search", "search.tools.code", "search.tools.people", "search.tools.subsystems")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    fn: ToolFn


TOOLS: dict[str, Tool] = {}


def register(name: str, description: str) -> Callable[[ToolFn], ToolFn]:
    def deco(fn: ToolFn) -> ToolFn:
        TOOLS[name] = Tool(name=name, description=description, fn=fn)
        return fn

    return deco


def load_tools() -> dict[str, Tool]:
    """Import every tool module (each registers its tools) and return the registry."""
    import importlib

    for module in TOOL_MODULES:
        importlib.import_module(module)
    return TOOLS


def run_tool(name: str, *, query: str, scope: QueryScope, limit: int = 10) -> list[Evidence]:
    """Run a registered tool. Raises ``KeyError`` for an unknown tool name."""
    load_tools()
    return TOOLS[name].fn(query=query, scope=scope, limit=limit)


_HIT_COLUMNS = HIT_COLUMNS.replace("d.content", "left(d.content, %(content_chars)s)")


def scoped_hits(
    scope: QueryScope,
    *,
    kinds: Sequence[str] | None = None,
    where: str = "",
    params: dict[str, Any] | None = None,
    order_by: str = "d.id",
    limit: int = 100,
    content_chars: int = 400_000,
) -> list[Hit]:
    """Rows of the unified table that ``scope`` may read, as :class:`Hit` objects (score 0).

    The scope's condition (tenant, allowed sources, principals; ``search.retrieval.scope_where_sql``)
    is always applied, inside the scope's tenant context (row-level security on top), and
    ``where`` (SQL on ``sources_document d`` with ``%(name)s`` placeholders from ``params``)
    narrows it. ``content`` is cut to ``content_chars`` characters. At most ``limit`` rows, in
    ``order_by`` order (a trusted SQL fragment, never user text). Empty when the scope allows
    no source.
    """
    if not scope.allowed_source_ids:
        return []
    scope_sql, scope_params = scope_where_sql(scope, kinds)
    all_params = {**(params or {}), **scope_params, "content_chars": content_chars, "row_limit": limit}
    extra = f" AND ({where})" if where else ""
    sql = f"""
        SELECT {_HIT_COLUMNS}
        FROM sources_document d JOIN sources_datasource s ON s.id = d.source_id
        WHERE {scope_sql}{extra}
        ORDER BY {order_by}
        LIMIT %(row_limit)s
    """
    with tenant_context(scope.tenant_id, user_id=scope.user_id), connection.cursor() as cursor:
        cursor.execute(sql, all_params)
        rows = cursor.fetchall()
    return [hit_from_row(r) for r in rows]
