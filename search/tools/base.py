"""The tool registry: name -> callable returning evidence rows for a question in a scope."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from search.pipeline.evidence import Evidence
from sources.selectors import QueryScope

ToolFn = Callable[..., list[Evidence]]


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


def run_tool(name: str, *, query: str, scope: QueryScope, limit: int = 10) -> list[Evidence]:
    """Run a registered tool. Raises ``KeyError`` for an unknown tool name."""
    import search.tools.search  # noqa: F401  (registers the tools)

    return TOOLS[name].fn(query=query, scope=scope, limit=limit)
