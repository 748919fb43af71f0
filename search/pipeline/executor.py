"""Executor: runs the planned tools in parallel with per-tool timeouts.

A failing or timed-out tool is reported in the result's ``tool_errors``, never fatal: by the
exception's type only (its message may quote SQL, file paths or a provider's reply; it goes to
the server log). Each tool runs in its own thread with its own database connection and opens
the tenant context itself; the thread runs in a copy of the caller's context variables
(``search.llm.without_llm`` among them).
"""

from __future__ import annotations

import contextvars
import logging
import time
from concurrent.futures import ThreadPoolExecutor, TimeoutError
from dataclasses import dataclass, field

from django.db import close_old_connections, connections

from search.pipeline.evidence import Evidence, number_evidence
from search.pipeline.planner import Plan
from search.tools.base import run_tool
from sources.selectors import QueryScope

logger = logging.getLogger(__name__)

TOOL_TIMEOUT_SECONDS = 20.0


def _tool_error(key: str, exc: BaseException) -> str:
    """What the answer's metadata says of a failed tool: the exception's type, never its message."""
    logger.warning("tool %s failed", key, exc_info=exc)
    return f"failed ({type(exc).__name__}); see the server log"


@dataclass
class ExecutionResult:
    evidence: list[Evidence]
    tools_run: list[dict]
    tool_errors: dict[str, str] = field(default_factory=dict)


def _run_in_thread(tool: str, query: str, scope: QueryScope, limit: int) -> tuple[list[Evidence], float]:
    close_old_connections()
    t0 = time.perf_counter()
    try:
        return run_tool(tool, query=query, scope=scope, limit=limit), (time.perf_counter() - t0) * 1000
    finally:
        connections.close_all()


def execute_plan(
    plan: Plan, scope: QueryScope, *, limit: int = 10, timeout: float = TOOL_TIMEOUT_SECONDS
) -> ExecutionResult:
    """Run ``plan``'s calls concurrently; merge their evidence, dedupe by document, number 1..n."""
    groups: list[list[Evidence]] = []
    tools_run: list[dict] = []
    errors: dict[str, str] = {}
    if len(plan.calls) == 1:  # one tool: no thread to start, same error handling
        call = plan.calls[0]
        t0 = time.perf_counter()
        try:
            rows = run_tool(call.tool, query=call.query, scope=scope, limit=limit)
            groups.append(rows)
            ms = (time.perf_counter() - t0) * 1000
            tools_run.append({"tool": call.tool, "query": call.query, "rows": len(rows), "ms": round(ms, 1)})
        except Exception as exc:
            key = f"{call.tool}({call.query[:60]})"
            errors[key] = _tool_error(key, exc)
            tools_run.append({"tool": call.tool, "query": call.query, "error": errors[key]})
        return ExecutionResult(evidence=number_evidence(groups, limit=limit), tools_run=tools_run, tool_errors=errors)
    pool = ThreadPoolExecutor(max_workers=max(1, len(plan.calls)), thread_name_prefix="kb-tool")
    try:
        # Each thread runs in a copy of the caller's context, so ``without_llm()`` holds there too.
        futures = [
            (call, pool.submit(contextvars.copy_context().run, _run_in_thread, call.tool, call.query, scope, limit))
            for call in plan.calls
        ]
        for call, future in futures:
            key = f"{call.tool}({call.query[:60]})"
            try:
                rows, ms = future.result(timeout=timeout)
                groups.append(rows)
                tools_run.append({"tool": call.tool, "query": call.query, "rows": len(rows), "ms": round(ms, 1)})
            except TimeoutError:
                errors[key] = f"timed out after {timeout:.0f} s"
                tools_run.append({"tool": call.tool, "query": call.query, "error": errors[key]})
            except Exception as exc:  # a broken tool never sinks the answer
                errors[key] = _tool_error(key, exc)
                tools_run.append({"tool": call.tool, "query": call.query, "error": errors[key]})
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return ExecutionResult(evidence=number_evidence(groups, limit=limit), tools_run=tools_run, tool_errors=errors)
