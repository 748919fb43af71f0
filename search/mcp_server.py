"""The MCP server: kbportal's retrieval primitives as narrow, LLM-free tools for agents.

Tools (Model Context Protocol, official ``mcp`` SDK's ``MCPServer``):

- ``search``, ``search_slack``, ``search_code``, ``recent_prs``: ranked evidence rows from the
  same tool functions the answer pipeline runs (``search.tools.base.run_tool``);
- ``who_knows``: people ranked by their part in the best evidence
  (``search.tools.people.who_knows``), each with the documents behind the score.

Inputs are narrow: ``query`` (1..1000 characters), ``limit`` (1..20, default 10) and an
optional ``project`` slug. Every call authenticates its API token again
(``projects.selectors.api_token_authenticate``: revoked, expired or forged tokens are refused
mid-session too) and builds the :class:`~sources.selectors.QueryScope` from the token's tenant,
user and project (``sources.selectors.scope_for_token``), so rows outside the tenant, the project's sources or
the user's principals are never read. Every call writes one ``search`` audit event with the
token's prefix, as the web page and the API do. Django ORM work runs in worker threads
(``anyio.to_thread``), each call on a fresh connection closed afterwards.

Transports: stdio (one token for the process, from ``KB_API_TOKEN``) and streamable HTTP (a
bearer token per request, checked by the SDK's ``TokenVerifier`` hook with
:class:`ApiTokenVerifier`; a missing or refused token gets HTTP 401 before any tool runs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import anyio.to_thread
from django.db import close_old_connections, connections
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field

from projects.selectors import ApiTokenRejected, ScopeNotFound, api_token_authenticate
from projects.services import api_token_touch
from search.pipeline.evidence import Evidence
from search.retrieval import InvalidQuery
from search.services import evidence_search, experts_find
from sources.selectors import QueryScope, scope_for_token

SERVER_NAME = "kbportal"
MAX_LIMIT = 20

T = TypeVar("T")

# No length cap here: the one limit (search.retrieval.MAX_QUERY_CHARS) and its error are clean_query's,
# as on every other path.
Query = Annotated[str, Field(min_length=1, description="The question or keywords to look for.")]
Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT, description=f"How many results, 1 to {MAX_LIMIT}.")]
ProjectSlug = Annotated[
    str | None,
    Field(
        max_length=80,
        pattern=r"^[-a-zA-Z0-9_]+$",
        description="Project slug to search in (default: the token's project or its user's default project).",
    ),
]


class EvidenceItem(BaseModel):
    """One ranked row. ``n`` is its 1-based rank; ``text`` at most 1,200 characters; ``score``
    the fused retrieval score (unitless, higher is better); ``updated_at`` ISO 8601 or null."""

    n: int
    title: str
    kind: str
    url: str = Field(description="The original link as ingested (may be a repository path#Lstart-Lend).")
    link: str = Field(description="Where to open it: the http(s) url, else the portal's document page.")
    location: str = Field(description="path:start-end for code, else the path or url.")
    path: str
    start_line: int | None
    end_line: int | None
    text: str
    score: float
    updated_at: str | None


class EvidenceResults(BaseModel):
    """The rows a search tool found, best first, in ``project``."""

    project: str
    results: list[EvidenceItem]


class ExpertItem(BaseModel):
    """A person, their score (sum of credits; unitless) and the documents that earned it."""

    name: str
    score: float
    aliases: list[str]
    documents: list[EvidenceItem]


class ExpertResults(BaseModel):
    """People who know about the question, best first, in ``project``."""

    project: str
    experts: list[ExpertItem]


def _authorized_scope(raw_token: str, project: str | None) -> tuple[QueryScope, str]:
    """The token's scope for ``project`` and the token's public prefix (for the audit event)."""
    try:
        identity = api_token_authenticate(raw_token)
        scope = scope_for_token(identity, project)
    except ApiTokenRejected as exc:
        raise ToolError(f"API token refused: {exc}") from exc
    except ScopeNotFound as exc:
        raise ToolError(str(exc)) from exc
    api_token_touch(identity=identity)
    return scope, identity.prefix


def _item(n: int, ev: Evidence) -> EvidenceItem:
    data = ev.as_dict()
    return EvidenceItem(n=n, **{k: data[k] for k in EvidenceItem.model_fields if k != "n"})


def evidence_for_token(raw_token: str, *, tool: str, query: str, limit: int, project: str | None) -> EvidenceResults:
    """Run evidence tool ``tool`` for the token's scope; rows numbered 1..n, best first.

    Raises ``ToolError`` for a refused token, an unknown or forbidden project, a blank query.
    Writes the ``search`` audit event (``search.services.search_record``) with the token's prefix.
    """
    scope, prefix = _authorized_scope(raw_token, project)
    try:  # the one search service, as the web page and the API run it (it never calls an LLM)
        rows = evidence_search(
            scope=scope, query=query, tool=tool, limit=min(max(limit, 1), MAX_LIMIT), token_prefix=prefix
        )
    except InvalidQuery as exc:
        raise ToolError(str(exc)) from exc
    return EvidenceResults(project=scope.project_slug, results=[_item(n, ev) for n, ev in enumerate(rows, 1)])


def experts_for_token(raw_token: str, *, query: str, limit: int, project: str | None) -> ExpertResults:
    """``who_knows`` for the token's scope. Raises ``ToolError`` and writes the audit event as
    :func:`evidence_for_token`."""
    scope, prefix = _authorized_scope(raw_token, project)
    try:
        experts = experts_find(scope=scope, query=query, limit=min(max(limit, 1), MAX_LIMIT), token_prefix=prefix)
    except InvalidQuery as exc:
        raise ToolError(str(exc)) from exc
    return ExpertResults(
        project=scope.project_slug,
        experts=[
            ExpertItem(
                name=e.name,
                score=round(e.score, 4),
                aliases=list(e.aliases),
                documents=[_item(n, ev) for n, ev in enumerate(e.documents, 1)],
            )
            for e in experts
        ],
    )


def _with_fresh_connection(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    close_old_connections()
    try:
        return fn(*args, **kwargs)
    finally:
        connections.close_all()


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run blocking Django code in a worker thread on its own database connection."""
    return await anyio.to_thread.run_sync(functools.partial(_with_fresh_connection, fn, *args, **kwargs))


class ApiTokenVerifier:
    """The SDK's ``TokenVerifier`` for kbportal API tokens (streamable HTTP, every request).

    Returns ``None`` (-> HTTP 401) for a malformed, unknown, revoked or expired token or one
    whose user left the tenant. ``client_id`` is the token's public ``kb_<prefix>``, the
    subject its user id, so the SDK binds an HTTP session to the token that opened it.
    """

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            identity = await in_thread(api_token_authenticate, token)
        except ApiTokenRejected:
            return None
        return AccessToken(
            token=token,
            client_id=f"kb_{identity.prefix}",
            scopes=[],
            expires_at=int(identity.expires_at.timestamp()) if identity.expires_at else None,
            subject=str(identity.user_id) if identity.user_id is not None else f"service:{identity.token_id}",
        )


INSTRUCTIONS = (
    "Search the company knowledge base (code, docs, Slack threads, commits) of one project. "
    "Results are ranked evidence rows with links; nothing is generated. Use search first, "
    "search_code / search_slack / recent_prs to narrow by kind, who_knows to find people."
)


EVIDENCE_TOOLS = {
    "search": "Hybrid (full-text + semantic) search over everything the project indexed: docs, code, "
    "Slack threads, commits. Returns ranked evidence rows with links.",
    "search_slack": "Search Slack threads and conversations only.",
    "search_code": "Search code only (files, functions, classes), with path and line ranges.",
    "recent_prs": "Commits and pull requests relevant to the query, newest first among the relevant.",
}  # name -> description; each returns ranked evidence rows (who_knows returns people)


def build_server(*, stdio_token: str | None = None, http_url: str | None = None) -> MCPServer:
    """The kbportal MCP server for one transport.

    ``stdio_token``: the token every call of this process uses (stdio), re-checked per call.
    ``http_url`` (e.g. ``http://127.0.0.1:8765``): serve streamable HTTP, each request carrying
    ``Authorization: Bearer <token>``. Exactly one of them. Raises ``ValueError`` otherwise.
    """
    if (stdio_token is None) == (http_url is None):
        raise ValueError("pass exactly one of stdio_token (stdio) or http_url (streamable HTTP)")
    auth_kwargs: dict[str, Any] = {}
    if http_url is not None:
        auth_kwargs = {
            "token_verifier": ApiTokenVerifier(),
            # The portal issues its own tokens; no OAuth metadata routes (resource_server_url None).
            "auth": AuthSettings(issuer_url=http_url, resource_server_url=None),  # type: ignore[arg-type]  # pydantic parses it
        }
    server = MCPServer(SERVER_NAME, instructions=INSTRUCTIONS, log_level="WARNING", **auth_kwargs)

    def raw_token() -> str:
        if stdio_token is not None:
            return stdio_token
        access = get_access_token()
        if access is None:  # the bearer middleware admits no request without one; fail closed anyway
            raise ToolError("API token required")
        return access.token

    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    def evidence_tool(name: str):
        async def tool(query: Query, limit: Limit = 10, project: ProjectSlug = None) -> EvidenceResults:
            return await in_thread(
                evidence_for_token, raw_token(), tool=name, query=query, limit=limit, project=project
            )

        return tool

    for name, description in EVIDENCE_TOOLS.items():
        server.tool(name=name, description=description, annotations=read_only)(evidence_tool(name))

    @server.tool(
        name="who_knows",
        description="People who know about the query (authors, reviewers, commenters and committers of the best "
        "matches), ranked, each with the documents behind their score.",
        annotations=read_only,
    )
    async def who_knows_tool(query: Query, limit: Limit = 10, project: ProjectSlug = None) -> ExpertResults:
        return await in_thread(experts_for_token, raw_token(), query=query, limit=limit, project=project)

    return server
