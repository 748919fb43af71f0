"""The operations every surface runs: ask, search and who-knows.

- ``ask_stream`` is the answer pipeline (plan -> execute -> evidence -> gate -> synthesize ->
  check); ``ask`` is the same stream consumed to its end. Every question is recorded as an
  ``AnswerRecord``, whose ``public_id`` is what feedback attaches to.
- ``evidence_search`` (the search page, ``GET /api/v1/search``, the MCP evidence tools) and
  ``experts_find`` (the people page, ``GET /api/v1/who-knows``, the MCP ``who_knows`` tool) run
  the same tool with the same options on every surface and write its ``search`` audit event.

Web views, API views, the MCP server and the CLI call these and nothing below them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from django.db import connection

from kbportal.audit import FROM_REQUEST, audit_record
from kbportal.tenancy import tenant_context
from projects.selectors import membership_list_for_user
from search.conversations import conversation_for_ask, conversation_start
from search.llm import without_llm
from search.models import AnswerFeedback, AnswerRecord, Conversation
from search.pipeline.checks import Answer, check_answer
from search.pipeline.drafts import Draft, closest_evidence
from search.pipeline.evidence import Evidence, evidence_from_hit, number_evidence
from search.pipeline.executor import execute_plan
from search.pipeline.followup import Rewrite, Turn, rewrite_followup
from search.pipeline.gate import Verdict, judge
from search.pipeline.planner import make_plan
from search.pipeline.synthesizer import synthesize_stream
from search.retrieval import MAX_QUERY_CHARS, clean_query, hybrid_search, scope_where_sql
from search.tools.base import run_tool
from search.tools.people import Expert, who_knows
from search.verified import VerifiedMatch, verified_answer_match
from sources.selectors import QueryScope


@dataclass
class AskResult:
    question: str
    answer: Answer
    evidence: list[Evidence]
    plan: dict[str, Any]
    tools_run: list[dict]
    tool_errors: dict[str, str]
    verdict: Verdict | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    answer_id: str = ""  # the AnswerRecord's public id (a UUID), for feedback
    rewrite: Rewrite | None = None  # how a follow-up was read (None: asked on its own)
    verified: VerifiedMatch | None = None  # a verified answer to the same question, shown first
    conversation_id: str = ""  # the Conversation's public id (a UUID) when in one

    @property
    def standalone_question(self) -> str:
        """What the pipeline answered: the follow-up's rewrite, else the question."""
        return self.rewrite.standalone if self.rewrite is not None else self.question

    @property
    def sources(self) -> list[Evidence]:
        """Exactly the cited evidence blocks, by number."""
        cited = set(self.answer.cited)
        return [e for e in self.evidence if e.n in cited]

    @property
    def closest(self) -> list[Evidence]:
        """The closest sources, shown when nothing is cited: those a decline names (``drafts.closest_evidence``)."""
        return closest_evidence(self.evidence)

    def as_dict(self) -> dict[str, Any]:
        return {
            "answer_id": self.answer_id,
            "conversation_id": self.conversation_id or None,
            "question": self.question,
            "standalone_question": self.standalone_question,
            "rewrite": rewrite_dict(self.rewrite),
            "verified": self.verified.as_dict() if self.verified is not None else None,
            "answer": self.answer.text,
            "answered": self.answer.answered,
            "synthesizer": self.answer.synthesizer,
            "cited": self.answer.cited,
            "sources": [e.as_dict() for e in self.sources],
            "evidence": [e.as_dict() for e in self.evidence],
            "plan": self.plan,
            "tools_run": self.tools_run,
            "tool_errors": self.tool_errors,
            "verdict": verdict_dict(self.verdict),
            "timings_ms": self.timings_ms,
        }


def verdict_dict(verdict: Verdict | None) -> dict[str, Any] | None:
    """The gate's verdict as JSON: ``status``, ``decided_by``, ``probability``, ``missing_terms``,
    ``missing_focus``, ``missing_type``, ``still_open``, ``features``."""
    if verdict is None:
        return None
    return {
        "status": verdict.status,
        "decided_by": verdict.decided_by,
        "probability": verdict.probability,
        "missing_terms": list(verdict.missing_terms),
        "missing_focus": verdict.missing_focus,
        "missing_type": verdict.missing_type,
        "still_open": verdict.still_open,
        "features": verdict.features,
    }


def rewrite_dict(rewrite: Rewrite | None) -> dict[str, Any]:
    """How a question was read as JSON: ``method`` (``none``, ``rules``, ``llm``), ``standalone``
    (what was answered), ``carried`` (earlier words the rule added), ``error`` (why the LLM
    rewrite fell back)."""
    if rewrite is None:
        return {"method": "none", "standalone": None, "carried": [], "error": ""}
    return {
        "method": rewrite.method,
        "standalone": rewrite.standalone,
        "carried": list(rewrite.carried),
        "error": rewrite.error,
    }


AskEventType = Literal["plan", "tools", "evidence", "token", "done"]


@dataclass(frozen=True)
class AskEvent:
    """One step of an answer in the making; ``data`` is JSON-serialisable (the wire payload).

    In order, each once except ``token``:

    - ``plan``: ``{planner: "llm"|"rules"|"fallback", tools: [name], calls: [{tool, query}], errors: [str],
      conversation_id: UUID|null, standalone_question, rewrite: {method, standalone, carried, error}}``
    - ``tools``: ``{tools_run: [{tool, query, rows, ms} | {tool, query, error}], errors: {call: message}, ms}``
    - ``evidence``: ``{evidence: [Evidence.as_dict()]}``, numbered ``n`` = 1..k
    - ``token`` (zero or more): ``{text}``, the next piece of the answer, citations already validated
    - ``done``: ``{answer_id, conversation_id, question, standalone_question, rewrite, verified: {id,
      question, text, verified_by, verified_at, stale, similarity, sources} | null, text, answered,
      synthesizer, cited: [n], sources: [Evidence.as_dict()], closest: [n],
      removed_citations: [n], error, fallback, checks: [name], verdict: {status, decided_by, probability,
      missing_terms, missing_focus, missing_type, still_open, features}, timings_ms: {plan, tools, gate,
      first_token, synthesize, total}}``

    ``done.text`` is the final answer. The tokens concatenate to it, except when the LLM failed
    after some text was sent, wrote an answer citing no evidence (citations attributed, or a
    decline), or named what no evidence holds (``fallback`` true, ``error`` says what changed):
    then ``done.text`` is the answer that replaces the streamed text. ``sources`` are
    exactly the cited blocks; ``closest`` the numbers of the blocks a decline names as closest
    (shown when nothing is cited). ``result`` is set on ``done`` only: the whole :class:`AskResult`,
    for in-process callers.
    """

    type: AskEventType
    data: dict[str, Any]
    result: AskResult | None = None


def indexed_kinds(scope: QueryScope) -> dict[str, int]:
    """``{kind: row count}`` of what the asker may read in the scope (the planner's view)."""
    where, params = scope_where_sql(scope, None)
    with tenant_context(scope.tenant_id, user_id=scope.user_id):
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT d.kind, count(*) FROM sources_document d WHERE {where} GROUP BY d.kind", params)
            return {kind: n for kind, n in cursor.fetchall()}


def ask_stream(
    question: str,
    scope: QueryScope,
    *,
    limit: int = 10,
    conversation_id: str | uuid.UUID | None = None,
    start_conversation: bool = False,
) -> Iterator[AskEvent]:
    """Answer ``question`` from the scope's sources as a stream of :class:`AskEvent` (see there).

    The question is checked before anything runs: raises ``search.retrieval.InvalidQuery`` for a
    blank or too long one, and ``search.conversations.ConversationNotFound`` for a
    ``conversation_id`` that is not the scope user's, at call time, not at the first event.
    In a conversation the question is read with its earlier turns in the same project
    (``search.pipeline.followup.rewrite_followup``) and the pipeline answers the rewrite;
    ``start_conversation`` (no id given) starts one titled by the question. Citations in ``token``
    and ``done`` are only numbers of the evidence. Records the question and answer
    (``AnswerRecord``) in the scope's tenant before ``done``. Timings are milliseconds from the
    start of the call.
    """
    question = clean_query(question)
    conversation: Conversation | None = None
    history: list[Turn] = []
    if conversation_id:
        conversation, history = conversation_for_ask(scope, conversation_id)
    return _ask_events(
        question,
        scope,
        limit=limit,
        conversation=conversation,
        history=history,
        start_conversation=start_conversation and conversation is None and scope.user_id is not None,
    )


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 1)


def _ask_events(
    asked: str,
    scope: QueryScope,
    *,
    limit: int,
    conversation: Conversation | None,
    history: list[Turn],
    start_conversation: bool,
) -> Iterator[AskEvent]:
    t0 = time.perf_counter()
    rewrite: Rewrite | None = None
    question = asked
    if conversation is not None:
        rewrite = rewrite_followup(asked, history)
        if rewrite.rewritten and len(rewrite.standalone) <= MAX_QUERY_CHARS:
            question = rewrite.standalone
        else:  # not rewritten, or a rule rewrite past the length limit: answered as asked
            rewrite = None
    elif start_conversation:
        conversation = conversation_start(scope, asked)
    conversation_id = str(conversation.public_id) if conversation is not None else ""
    plan = make_plan(question, indexed_kinds=indexed_kinds(scope))
    plan_info = {
        "planner": plan.planner,
        "tools": plan.tool_names,
        "calls": [{"tool": c.tool, "query": c.query} for c in plan.calls],
        "errors": plan.errors,
        "conversation_id": conversation_id or None,
        "standalone_question": question,
        "rewrite": rewrite_dict(rewrite),
    }
    timings = {"plan": _ms(t0)}
    yield AskEvent("plan", plan_info)
    verified = verified_answer_match(question, scope)

    t_tools = time.perf_counter()
    execution = execute_plan(plan, scope, limit=limit)
    timings["tools"] = _ms(t_tools)
    yield AskEvent("tools", {"tools_run": execution.tools_run, "errors": execution.tool_errors, "ms": timings["tools"]})
    yield AskEvent("evidence", {"evidence": [e.as_dict() for e in execution.evidence]})

    t_gate = time.perf_counter()
    verdict = judge(question, execution.evidence, scope)
    timings["gate"] = _ms(t_gate)

    t_synth = time.perf_counter()
    draft: Draft | None = None
    for item in synthesize_stream(question, execution.evidence, verdict=verdict):
        if isinstance(item, Draft):
            draft = item
            break
        timings.setdefault("first_token", _ms(t0))
        yield AskEvent("token", {"text": item})
    assert draft is not None, "synthesize_stream ends with a Draft"
    answer = check_answer(question, execution.evidence, verdict, draft)
    timings["synthesize"] = _ms(t_synth)
    timings["total"] = _ms(t0)

    result = AskResult(
        question=asked,
        answer=answer,
        evidence=execution.evidence,
        plan=plan_info,
        tools_run=execution.tools_run,
        tool_errors=execution.tool_errors,
        verdict=verdict,
        timings_ms=timings,
        rewrite=rewrite,
        conversation_id=conversation_id,
        verified=verified,
    )
    result.answer_id = str(answer_record_create(scope=scope, result=result, conversation=conversation).public_id)
    yield AskEvent(
        "done",
        {
            "answer_id": result.answer_id,
            "conversation_id": conversation_id or None,
            "question": asked,
            "standalone_question": question,
            "rewrite": rewrite_dict(result.rewrite),
            "verified": verified.as_dict() if verified is not None else None,
            "text": answer.text,
            "answered": answer.answered,
            "synthesizer": answer.synthesizer,
            "cited": answer.cited,
            "sources": [e.as_dict() for e in result.sources],
            "closest": [e.n for e in result.closest],
            "removed_citations": answer.removed_citations,
            "error": answer.error,
            "fallback": bool(answer.error),
            "checks": answer.checks,
            "verdict": verdict_dict(verdict),
            "timings_ms": timings,
        },
        result=result,
    )


def ask(
    question: str,
    scope: QueryScope,
    *,
    limit: int = 10,
    conversation_id: str | uuid.UUID | None = None,
    start_conversation: bool = False,
) -> AskResult:
    """Answer ``question`` from the scope's sources, with ``[n]`` citations: :func:`ask_stream`
    consumed to its end (the same arguments and errors).

    Raises ``search.retrieval.InvalidQuery`` for a blank or too long question. Timings are in milliseconds.
    """
    events = ask_stream(
        question, scope, limit=limit, conversation_id=conversation_id, start_conversation=start_conversation
    )
    for event in events:
        if event.type == "done" and event.result is not None:
            return event.result
    raise AssertionError("ask_stream ended without a done event")


def _db_text(text: str) -> str:
    return text.replace("\x00", "")  # PostgreSQL text cannot hold NUL; an LLM may still emit it


def shown_document_ids(ev: Evidence) -> list[int]:
    """The documents a block shows: its rows, or for a who-knows person block the documents
    its text names (``metadata["documents"]``)."""
    ids = [i for i in ev.document_ids if i > 0]
    named_documents = (ev.metadata.get("documents") or []) if ev.kind == "person" else []
    for named in named_documents:
        if isinstance(named, dict) and isinstance(named.get("document_id"), int) and named["document_id"] > 0:
            ids.append(named["document_id"])
    if ev.kind == "person":
        ids.extend(i for i in ev.metadata.get("named_in") or [] if isinstance(i, int) and i > 0)
    return list(dict.fromkeys(ids))


def _stored_source(ev: Evidence) -> dict[str, Any]:
    data = ev.as_dict()
    keep = ("n", "title", "link", "kind", "location", "updated_at", "sections")
    shown = {key: data.get(key) for key in keep}
    shown["text"] = _db_text(str(data.get("text") or ""))[: AnswerRecord.SOURCE_TEXT_CHARS]
    if ev.kind == "person":  # the documents crediting the person, listed under them (``shown_document_ids``)
        documents = [d for d in ev.metadata.get("documents") or [] if isinstance(d, dict) and d.get("title")]
        shown["metadata"] = {
            "documents": [{k: d.get(k) for k in ("title", "link", "role", "location")} for d in documents]
        }
    return shown


def answer_record_create(
    *, scope: QueryScope, result: AskResult, conversation: Conversation | None = None
) -> AnswerRecord:
    """Record an asked question and its answer in the scope's tenant; returns the row.

    In a ``conversation``, the record is its next turn (the conversation's ``updated_at`` moves)
    and keeps the rewrite the pipeline answered.

    Runs in its own tenant-context transaction, which also writes the ``ask`` audit event
    (question, answer id, project, evidence and cited document ids). Stores document ids (not
    foreign keys) of the evidence and of the cited blocks, the tools' report, and the timings
    (milliseconds).
    """
    with tenant_context(scope.tenant_id, user_id=scope.user_id):
        record = AnswerRecord.objects.create(
            tenant_id=scope.tenant_id,
            user_id=scope.user_id,
            project_id=scope.project_id,
            conversation=conversation,
            question=_db_text(result.question),
            standalone_question=_db_text(result.rewrite.standalone) if result.rewrite is not None else "",
            rewrite_method=result.rewrite.method if result.rewrite is not None else "",
            answer=_db_text(result.answer.text),
            answered=result.answer.answered,
            planner=result.plan.get("planner", ""),
            synthesizer=result.answer.synthesizer,
            tools=result.tools_run,
            # documents only: a who-knows person block stands in with a negative id (search.tools.people.person_id);
            # the documents it names (titles in its text) count as shown, for the share link's check
            evidence_document_ids=list(dict.fromkeys(i for e in result.evidence for i in shown_document_ids(e))),
            cited_document_ids=[i for e in result.sources for i in e.document_ids if i > 0],
            cited_sources=[_stored_source(e) for e in result.sources],
            latency_ms=result.timings_ms.get("total", 0.0),
            first_token_ms=result.timings_ms.get("first_token"),
            error=result.answer.error,
        )
        if conversation is not None:
            Conversation.objects.filter(pk=conversation.pk).update(updated_at=record.created_at)
        audit_record(
            action="ask",
            tenant_id=scope.tenant_id,
            actor=scope.user_id,
            object_type="search.answerrecord",
            object_id=record.pk,
            data={
                "question": record.question,
                "answer_id": str(record.public_id),
                "conversation_id": str(conversation.public_id) if conversation is not None else None,
                "project": scope.project_slug,
                "answered": record.answered,
                "evidence_ids": record.evidence_document_ids,
                "cited_ids": record.cited_document_ids,
                "tools": [t.get("tool") for t in record.tools if isinstance(t, dict)],
                "latency_ms": record.latency_ms,
            },
        )
    return record


def search_record(
    *,
    scope: QueryScope,
    query: str,
    document_ids: list[int],
    tool: str = "search",
    kinds: list[str] | None = None,
    people: list[str] | None = None,
    count: int | None = None,
    token_prefix: Any = FROM_REQUEST,
) -> None:
    """Write the ``search`` audit event of a search the web page, the API or an MCP tool ran for
    ``scope``.

    ``data``: ``tool`` (``search``, ``who_knows`` or the MCP tool's name), ``query``, ``project``
    (slug), ``hits`` (the ids of every document returned, in rank order), ``count`` (the
    results returned, ``len(document_ids)`` unless given: a result may show several documents), and ``kinds`` or
    ``people`` when given. The actor is the scope's user; the token prefix is ``token_prefix``
    (default: the request's, as the request id), so an MCP call outside a Django request passes
    its token's.
    """
    data: dict[str, Any] = {
        "tool": tool,
        "query": query,
        "project": scope.project_slug,
        "hits": list(document_ids),
        "count": len(document_ids) if count is None else count,
    }
    if kinds:
        data["kinds"] = list(kinds)
    if people is not None:
        data["people"] = list(people)
    audit_record(action="search", tenant_id=scope.tenant_id, actor=scope.user_id, token_prefix=token_prefix, data=data)


EVIDENCE_SEARCH_TOOLS = ("search", "search_slack", "search_code", "recent_prs")


def evidence_search(
    *,
    scope: QueryScope,
    query: str,
    limit: int,
    tool: str = "search",
    kinds: list[str] | None = None,
    token_prefix: Any = FROM_REQUEST,
) -> list[Evidence]:
    """Run evidence tool ``tool`` (``EVIDENCE_SEARCH_TOOLS``) for ``query`` in ``scope``: at most
    ``limit`` blocks numbered 1..n, one per document (its other sections merged into it), best
    first. ``kinds`` (``search`` only) keeps rows of those kinds. Never calls an LLM: the
    ranking is the fusion order with near-duplicates collapsed, the same on every surface.

    Raises ``search.retrieval.InvalidQuery`` for a blank or too long query, ``KeyError`` for
    an unknown tool and ``ValueError`` for ``kinds`` given to another tool than ``search`` (or a
    negative ``limit``). Writes the ``search`` audit event (:func:`search_record`) naming every
    document a block shows (a block's merged sections too).
    """
    if tool not in EVIDENCE_SEARCH_TOOLS:
        raise KeyError(tool)
    if kinds and tool != "search":
        raise ValueError(f"kinds: only the search tool filters by kind, not {tool}")
    if limit < 0:
        raise ValueError(f"limit: must be 0 or more, not {limit}")
    query = clean_query(query)
    with without_llm():
        if kinds:
            hits = hybrid_search(query, scope, limit=limit, kinds=kinds, rerank=True).hits
            rows = [evidence_from_hit(h, tool=tool, query=query) for h in hits]
        else:
            rows = run_tool(tool, query=query, scope=scope, limit=limit)
    evidence = number_evidence([rows], limit=limit)
    search_record(
        scope=scope,
        query=query,
        tool=tool,
        document_ids=list(dict.fromkeys(i for ev in evidence for i in ev.document_ids)),
        count=len(evidence),
        kinds=kinds,
        token_prefix=token_prefix,
    )
    return evidence


def experts_find(*, scope: QueryScope, query: str, limit: int, token_prefix: Any = FROM_REQUEST) -> list[Expert]:
    """Who knows about ``query`` in ``scope``: at most ``limit`` people, best first, each with the
    documents behind their score (``search.tools.people.who_knows``). Raises
    ``search.retrieval.InvalidQuery`` for a blank or too long query. Writes the ``search`` audit
    event (tool ``who_knows``, the documents and the people named, ``count`` the people). Raises ``ValueError`` for
    a negative ``limit``."""
    if limit < 0:
        raise ValueError(f"limit: must be 0 or more, not {limit}")
    query = clean_query(query)
    experts = who_knows(query=query, scope=scope, limit=limit)
    search_record(
        scope=scope,
        query=query,
        tool="who_knows",
        document_ids=list(dict.fromkeys(d.document_id for e in experts for d in e.documents)),
        people=[e.name for e in experts],
        count=len(experts),
        token_prefix=token_prefix,
    )
    return experts


class AnswerNotFound(LookupError):
    """No answer with that id that this user asked (another user's or tenant's answer: the same)."""


FEEDBACK_COMMENT_CHARS = 2000


def answer_feedback_submit(*, actor, answer_id: str | uuid.UUID, vote: int, comment: str = "") -> AnswerFeedback:
    """Store ``actor``'s vote (+1 or -1) and optional comment on an answer they asked.

    Voting again on the same answer replaces the earlier vote and comment. Only the asker may
    vote: an answer of another user, of another tenant, or of a tenant the actor has left raises
    ``AnswerNotFound`` (a view answers 404). Raises ``ValueError`` for a vote other than +1/-1.
    The comment is cut to ``FEEDBACK_COMMENT_CHARS`` characters. One transaction, with the
    ``feedback`` audit event (answer id, vote, comment).
    """
    if vote not in (AnswerFeedback.Vote.UP, AnswerFeedback.Vote.DOWN):
        raise ValueError("vote must be +1 or -1")
    try:
        public_id = uuid.UUID(str(answer_id))
    except ValueError as exc:
        raise AnswerNotFound("no such answer") from exc
    comment = _db_text(comment or "").strip()[:FEEDBACK_COMMENT_CHARS]
    for membership in membership_list_for_user(actor):
        with tenant_context(membership.tenant_id, user_id=actor.pk):
            record = AnswerRecord.objects.filter(public_id=public_id, user=actor).first()
            if record is None:
                continue
            feedback, _ = AnswerFeedback.objects.update_or_create(
                answer_record=record,
                user=actor,
                defaults={
                    "tenant_id": record.tenant_id,
                    "project_id": record.project_id,
                    "question": record.question,
                    "answer": record.answer,
                    "cited_document_ids": record.cited_document_ids,
                    "vote": int(vote),
                    "comment": comment,
                },
            )
            audit_record(
                action="feedback",
                tenant_id=record.tenant_id,
                actor=actor,
                object_type="search.answerrecord",
                object_id=record.pk,
                data={"answer_id": str(record.public_id), "vote": feedback.vote, "comment": comment},
            )
            return feedback
    raise AnswerNotFound("no such answer")
