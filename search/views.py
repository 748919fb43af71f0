"""Web pages: ask (cited answer + sources, streamed over server-sent events), search (ranked
hits), who knows (people for a topic), answer feedback, and for the tenant's admins the audit
log (with CSV export) and the analytics dashboard. Logic lives in services, selectors and tools."""

from __future__ import annotations

import csv
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from django_ratelimit.core import get_usage

from kbportal.audit import (
    ACTIONS,
    AUDIT_CSV_HEADER,
    AuditFilters,
    audit_event_csv_row,
    audit_event_iter,
    audit_event_page,
)
from projects.selectors import ScopeNotFound, project_list_for_user, user_is_tenant_admin, user_tenant_id
from search.analytics import ANALYTICS_DAYS_MAX, Analytics, analytics_get
from search.conversations import (
    ConversationListing,
    ConversationNotFound,
    ConversationTurn,
    conversation_get_for_user,
)
from search.rendering import VERIFIED_ANCHOR, answer_html
from search.retrieval import MAX_QUERY_CHARS, InvalidQuery, safe_link
from search.services import AnswerNotFound, answer_feedback_submit, ask, ask_stream, evidence_search, experts_find
from search.sse import server_sent_events
from sources.selectors import DocumentNotFound, document_get_for_user, scope_for_user, user_principals

logger = logging.getLogger(__name__)

_SLUG = re.compile(r"[-a-zA-Z0-9_]{1,80}")

PAGE_HITS = 20  # rows the search page lists
PAGE_EXPERTS = 10  # people the who-knows page lists


def _scope_or_onboarding(request: HttpRequest, default_project: str | None = None):
    """``(scope, None)`` for the page's ``project`` (else ``default_project`` when the user may
    still read it, else their default), or ``(None, response)``: 404 for an unknown or foreign
    ``project``, the onboarding page for a user with no project at all."""
    if not request.GET.get("project") and default_project and _SLUG.fullmatch(default_project):
        try:
            return scope_for_user(request.user, default_project), None
        except ScopeNotFound:
            pass  # the conversation's project is gone or closed to the user: their default one
    project = request.GET.get("project") or None
    if project is not None and not _SLUG.fullmatch(project):
        return None, render(request, "search/not_found.html", {"message": "no such project"}, status=404)
    try:
        return scope_for_user(request.user, project), None
    except ScopeNotFound as exc:
        if request.GET.get("project"):
            return None, render(request, "search/not_found.html", {"message": str(exc)}, status=404)
        return None, redirect("projects:onboarding")


def _scope_or_404(request: HttpRequest):
    """The scope for an endpoint that cannot send the user to onboarding: ``(scope, None)`` or
    ``(None, 404 response)`` for an unknown or foreign project, or no project at all."""
    project = request.GET.get("project") or None
    if project is not None and not _SLUG.fullmatch(project):
        return None, HttpResponse("no such project", status=404, content_type="text/plain")
    try:
        return scope_for_user(request.user, project), None
    except ScopeNotFound as exc:
        return None, HttpResponse(str(exc), status=404, content_type="text/plain")


def _same_origin_request(request: HttpRequest) -> bool:
    """Whether a GET that would ask (spend LLM calls, store an answer) came from the portal itself.

    Browsers send ``Sec-Fetch-Site``: ``same-origin`` (our form, our EventSource) or ``none``
    (typed, bookmarked) pass; ``cross-site``/``same-site`` (a link or image on another site) do
    not. Without that header (older browsers, scripts), an ``Origin`` or ``Referer`` naming
    another host fails; a request with none of the three passes (a non-browser client cannot be
    made to send a victim's cookies).
    """
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site.strip().lower() in {"same-origin", "none"}
    for header in ("Origin", "Referer"):
        value = request.headers.get(header)
        if value:
            if value == "null":
                return False
            parts = urlsplit(value)
            return parts.scheme in {"http", "https"} and parts.netloc == request.get_host()
    return True


def _ask_rate_limited(request: HttpRequest) -> int | None:
    """Count one question for the user against ``settings.KB_ASK_RATE`` (django-ratelimit, in
    Django's cache). Returns the seconds until the window resets when over the rate, else ``None``."""
    usage = get_usage(request, group="web-ask", key="user", rate=settings.KB_ASK_RATE, increment=True)
    if usage is not None and usage["should_limit"]:
        return max(1, int(usage["time_left"]))
    return None


def _rate_limit_message(retry_after: int) -> str:
    return (
        f"You have asked too many questions (the limit is {settings.KB_ASK_RATE.replace('/', ' per ')}). "
        f"Try again in {retry_after} second{'s' if retry_after != 1 else ''}."
    )


def _shown_turn(turn: ConversationTurn, anchor: str) -> dict:
    cited = [s["n"] for s in turn.sources if isinstance(s.get("n"), int)]
    return {"turn": turn, "html": answer_html(turn.answer, cited, anchor=anchor), "anchor": anchor}


@login_required
def ask_page(request: HttpRequest) -> HttpResponse:
    """``GET /?q=...&project=...&conversation=...``: the cited answer in one page load (the form
    without JavaScript).

    Every question asked here is a turn of a conversation: ``conversation`` (the user's own, else
    404) continues one, shown above the form with its earlier turns and in its own project
    unless ``project`` says otherwise; without it, a question starts one. A question from
    another site's link is not asked: the page shows it in the box with a note, and one press of
    Ask (a same-origin request) runs it. Over ``KB_ASK_RATE``: 429 with ``Retry-After``
    (seconds) and a page saying when to try again.
    """
    conversation_id = request.GET.get("conversation", "").strip()
    conversation: ConversationListing | None = None
    turns: list[ConversationTurn] = []
    if conversation_id:
        try:
            conversation, turns = conversation_get_for_user(request.user, conversation_id)
        except ConversationNotFound:
            return render(request, "search/not_found.html", {"message": "no such conversation"}, status=404)
    scope, response = _scope_or_onboarding(request, conversation.project if conversation is not None else None)
    if response is not None:
        return response
    question = request.GET.get("q", "")
    context = {
        "scope": scope,
        "question": question,
        "projects": project_list_for_user(request.user, tenant_id=scope.tenant_id),
        "max_question_chars": MAX_QUERY_CHARS,
        "conversation": conversation,
        "conversation_id": conversation.id if conversation is not None else "",
        "turns": [_shown_turn(turn, f"t{i}-source-") for i, turn in enumerate(turns, start=1)],
    }
    if "q" in request.GET and not _same_origin_request(request):
        context["error"] = "This question came from a link on another site, so it was not asked. Press Ask to ask it."
        return render(request, "search/ask.html", context)
    if "q" in request.GET and question.strip():
        retry_after = _ask_rate_limited(request)
        if retry_after is not None:
            response = render(
                request, "security/rate_limited.html", {"message": _rate_limit_message(retry_after)}, status=429
            )
            response["Retry-After"] = str(retry_after)
            return response
    if "q" in request.GET:
        try:
            result = ask(question, scope, conversation_id=conversation_id or None, start_conversation=True)
            context["result"] = result
            context["conversation_id"] = result.conversation_id
            context["answer_html"] = answer_html(result.answer.text, result.answer.cited)
            if result.verified is not None:
                cited = [s["n"] for s in result.verified.sources if isinstance(s.get("n"), int)]
                context["verified_html"] = answer_html(result.verified.text, cited, anchor=VERIFIED_ANCHOR)
        except InvalidQuery as exc:
            context["error"] = str(exc)
        except ConversationNotFound as exc:  # the conversation is in another project than the one asked in
            context["error"] = f"{exc}; start a new conversation to ask there."
    return render(request, "search/ask.html", context)


@login_required
@require_GET
def ask_stream_view(request: HttpRequest) -> HttpResponseBase:
    """``GET /ask/stream?q=...&project=...&conversation=...``: the answer as server-sent events
    (see ``AskEvent``), a turn of ``conversation`` or the first of a new one.

    404 for a project or conversation the user may not use; 400 for a blank question; 403 for a request from
    another site (``Sec-Fetch-Site``/``Origin``/``Referer``); over ``KB_ASK_RATE``, 429 with
    ``Retry-After`` and one ``failed`` event naming the wait.
    """
    if not _same_origin_request(request):
        return HttpResponse(
            "questions are asked from the portal's own pages only (this request came from another site)",
            status=403,
            content_type="text/plain",
        )
    scope, response = _scope_or_404(request)
    if response is not None:
        return response
    if request.GET.get("q", "").strip():
        retry_after = _ask_rate_limited(request)
        if retry_after is not None:
            event = json.dumps({"message": _rate_limit_message(retry_after), "retry_after": retry_after})
            response = HttpResponse(f"event: failed\ndata: {event}\n\n", status=429, content_type="text/event-stream")
            response["Retry-After"] = str(retry_after)
            return response
    try:
        events = ask_stream(
            request.GET.get("q", ""),
            scope,
            conversation_id=request.GET.get("conversation", "").strip() or None,
            start_conversation=True,
        )
    except InvalidQuery as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain")
    except ConversationNotFound:
        return HttpResponse("no such conversation", status=404, content_type="text/plain")
    response = StreamingHttpResponse(server_sent_events(events), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event through at once
    return response


_VOTES = {"up": 1, "down": -1, "1": 1, "-1": -1, "+1": 1}


@login_required
@require_POST
def answer_feedback(request: HttpRequest, answer_id) -> HttpResponse:
    """``POST /answers/<uuid>/feedback`` (``vote`` = up|down, optional ``comment``), CSRF-checked.

    Only the asker may vote: anyone else's answer is 404. JSON for ``Accept: application/json``
    (the page's script), else back to the ask page with a message.
    """
    wants_json = "application/json" in request.headers.get("Accept", "")
    vote = _VOTES.get(request.POST.get("vote", ""))
    if vote is None:
        if wants_json:
            return JsonResponse({"error": "vote must be up or down"}, status=400)
        return HttpResponse("vote must be up or down", status=400, content_type="text/plain")
    try:
        feedback = answer_feedback_submit(
            actor=request.user, answer_id=answer_id, vote=vote, comment=request.POST.get("comment", "")
        )
    except AnswerNotFound:
        if wants_json:
            return JsonResponse({"error": "no such answer"}, status=404)
        return render(request, "search/not_found.html", {"message": "no such answer"}, status=404)
    if wants_json:
        return JsonResponse({"answer_id": str(answer_id), "vote": feedback.vote})
    messages.success(request, "Thanks, your feedback on the answer was recorded.")
    return redirect("search:ask")


@login_required
def people_page(request: HttpRequest) -> HttpResponse:
    """``/people/?q=...``: who knows about a topic, each person with the documents behind the score."""
    scope, response = _scope_or_onboarding(request)
    if response is not None:
        return response
    query = request.GET.get("q", "")
    context = {
        "scope": scope,
        "question": query,
        # the tenant the scope was built in (the user's, read once this request)
        "projects": project_list_for_user(request.user, tenant_id=scope.tenant_id),
    }
    if "q" in request.GET:
        try:
            context["experts"] = experts_find(scope=scope, query=query, limit=PAGE_EXPERTS)
        except InvalidQuery as exc:
            context["error"] = str(exc)
    return render(request, "search/people.html", context)


@login_required
def search_page(request: HttpRequest) -> HttpResponse:
    scope, response = _scope_or_onboarding(request)
    if response is not None:
        return response
    query = request.GET.get("q", "")
    context = {
        "scope": scope,
        "question": query,
        # the tenant the scope was built in (the user's, read once this request)
        "projects": project_list_for_user(request.user, tenant_id=scope.tenant_id),
    }
    if "q" in request.GET:
        try:
            context["hits"] = evidence_search(scope=scope, query=query, limit=PAGE_HITS)
        except InvalidQuery as exc:
            context["error"] = str(exc)
    return render(request, "search/search.html", context)


@login_required
def document_page(request: HttpRequest, source_public_id) -> HttpResponse:
    """One indexed row: its content (numbered lines for code), where it came from, its link."""
    try:
        document, source = document_get_for_user(
            request.user, source_public_id=str(source_public_id), external_id=request.GET.get("id", "")
        )
    except DocumentNotFound:
        return render(request, "search/not_found.html", {"message": "no such document"}, status=404)
    first = document.start_line or 1
    lines = [(first + i, line) for i, line in enumerate(document.content.splitlines())]
    context = {
        "document": document,
        "source": source,
        "lines": lines,
        "numbered": document.start_line is not None,
        "external_link": safe_link(document.url),
    }
    return render(request, "search/document.html", context)


# ---------- the tenant admins' pages: audit log and analytics -----------------------------------


def _admin_tenant_or_404(request: HttpRequest) -> int | HttpResponse:
    """The tenant id when the user is an owner or admin of their tenant, else a 404 page: members
    and people without an organization are not told the page exists."""
    tenant_id = user_tenant_id(request.user)
    if tenant_id is None or not user_is_tenant_admin(request.user, tenant_id):
        return render(request, "search/not_found.html", {"message": "no such page"}, status=404)
    return tenant_id


class AuditFilterForm(forms.Form):
    action = forms.ChoiceField(choices=[("", "any action")] + [(a, a) for a in ACTIONS], required=False)
    actor = forms.CharField(max_length=150, required=False, label="Actor (username or token prefix)")
    since = forms.DateField(required=False, label="From (UTC date)", widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, label="To (UTC date)", widget=forms.DateInput(attrs={"type": "date"}))
    text = forms.CharField(max_length=200, required=False, label="Text in the details")

    def filters(self) -> AuditFilters:
        """The valid fields as :class:`AuditFilters` (an invalid field does not filter)."""
        data = getattr(self, "cleaned_data", {})
        return AuditFilters(
            action=data.get("action") or "",
            actor=(data.get("actor") or "").strip(),
            since=data.get("since"),
            until=data.get("until"),
            text=(data.get("text") or "").strip().replace("\x00", ""),
        )


@login_required
@require_GET
def audit_page(request: HttpRequest) -> HttpResponse:
    """``/audit/``: the tenant's audit log, newest first, 50 a page, filtered by action, actor,
    UTC date range and text in the details. Owners and admins of the tenant only (404 otherwise)."""
    tenant_id = _admin_tenant_or_404(request)
    if isinstance(tenant_id, HttpResponse):
        return tenant_id
    form = AuditFilterForm(request.GET)
    form.is_valid()
    filters = form.filters()
    try:
        page_number = max(1, int(request.GET.get("page", "1")))
    except ValueError:
        page_number = 1
    page = audit_event_page(tenant_id=tenant_id, filters=filters, page=page_number)
    rows = [
        (event, json.dumps(event.data, cls=DjangoJSONEncoder, ensure_ascii=False, sort_keys=True))
        for event in page.events
    ]
    context = {"form": form, "page": page, "rows": rows, "query_string": urlencode(filters.as_query())}
    return render(request, "search/audit.html", context)


class _Echo:
    """A file-like object whose ``write`` returns the text (csv.writer into a streamed response)."""

    def write(self, value: str) -> str:
        return value


def _audit_csv(tenant_id: int, filters: AuditFilters) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(AUDIT_CSV_HEADER)
    for event in audit_event_iter(tenant_id=tenant_id, filters=filters):
        yield writer.writerow(audit_event_csv_row(event))


@login_required
@require_GET
def audit_export(request: HttpRequest) -> HttpResponseBase:
    """``/audit/export.csv``: every event matching the page's filters, streamed as CSV (UTF-8,
    header row ``AUDIT_CSV_HEADER``). Owners and admins only (404); invalid filters: 400."""
    tenant_id = _admin_tenant_or_404(request)
    if isinstance(tenant_id, HttpResponse):
        return tenant_id
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        errors = "; ".join(f"{field}: {' '.join(str(m) for m in msgs)}" for field, msgs in form.errors.items())
        return HttpResponse(errors, status=400, content_type="text/plain")
    stream = StreamingHttpResponse(_audit_csv(tenant_id, form.filters()), content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    stream["Content-Disposition"] = f'attachment; filename="audit-{stamp}.csv"'
    return stream


# Charts: geometry here, markup (auto-escaped) in templates/search/_chart.html.
CHART_WIDTH, CHART_HEIGHT, CHART_PAD = 640, 160, 28


@dataclass(frozen=True)
class _Bar:
    x: float
    y: float
    width: float
    height: float
    label: str
    value: str


@dataclass(frozen=True)
class _Line:
    name: str
    css_class: str
    points: str  # "x,y x,y ..." for <polyline>


@dataclass(frozen=True)
class _Chart:
    title: str
    width: int
    height: int
    baseline: float
    top: float
    max_label: str
    first_label: str
    last_label: str
    bars: list[_Bar]
    lines: list[_Line]


def _number(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _chart(
    title: str,
    labels: list[str],
    *,
    bars: list[float] | None = None,
    lines: dict[str, list[float | None]] | None = None,
) -> _Chart:
    """Bar and/or line geometry for ``labels`` (one slot each), scaled to the largest value."""
    lines = lines or {}
    values = [v for v in (bars or [])] + [v for series in lines.values() for v in series if v is not None]
    top_value = max(values, default=0) or 1
    inner_h = CHART_HEIGHT - 2 * CHART_PAD
    slot = (CHART_WIDTH - 2 * CHART_PAD) / max(len(labels), 1)

    def y(value: float) -> float:
        return round(CHART_PAD + inner_h * (1 - value / top_value), 1)

    chart_bars = [
        _Bar(
            x=round(CHART_PAD + i * slot + slot * 0.1, 1),
            y=y(value),
            width=round(slot * 0.8, 1),
            height=round(CHART_PAD + inner_h - y(value), 1),
            label=labels[i],
            value=_number(value),
        )
        for i, value in enumerate(bars or [])
    ]
    chart_lines = []
    for n, (name, series) in enumerate(lines.items()):
        points = " ".join(
            f"{round(CHART_PAD + i * slot + slot / 2, 1)},{y(v)}" for i, v in enumerate(series) if v is not None
        )
        chart_lines.append(_Line(name=name, css_class=f"series-{n}", points=points))
    return _Chart(
        title=title,
        width=CHART_WIDTH,
        height=CHART_HEIGHT,
        baseline=CHART_PAD + inner_h,
        top=CHART_PAD,
        max_label=_number(top_value if values else 0),
        first_label=labels[0] if labels else "",
        last_label=labels[-1] if labels else "",
        bars=chart_bars,
        lines=chart_lines,
    )


def _analytics_charts(analytics: Analytics) -> list[_Chart]:
    labels = [d.day.isoformat() for d in analytics.per_day]
    return [
        _chart("Questions per day", labels, bars=[d.questions for d in analytics.per_day]),
        _chart(
            "Answer latency per day (ms)",
            labels,
            lines={
                "p50": [d.latency_p50_ms for d in analytics.per_day],
                "p95": [d.latency_p95_ms for d in analytics.per_day],
            },
        ),
        _chart("Active users per day", labels, bars=[d.users for d in analytics.per_day]),
    ]


@login_required
@require_GET
def analytics_page(request: HttpRequest) -> HttpResponse:
    """``/analytics/?project=&days=``: questions, latency, unanswered rate, top and zero-result
    questions, feedback, most-cited documents and sources, active users (``search.analytics``),
    as inline SVG charts beside tables of the same numbers. Owners and admins only (404); an
    unknown project is 404 too; ``days`` is 1..365 (default 30)."""
    tenant_id = _admin_tenant_or_404(request)
    if isinstance(tenant_id, HttpResponse):
        return tenant_id
    projects = project_list_for_user(request.user)
    slug = request.GET.get("project") or None
    project = next((p for p in projects if p.slug == slug), None)
    if slug is not None and project is None:
        return render(request, "search/not_found.html", {"message": "no such project"}, status=404)
    try:
        days = min(max(int(request.GET.get("days", "30")), 1), ANALYTICS_DAYS_MAX)
    except ValueError:
        days = 30
    analytics = analytics_get(
        tenant_id=tenant_id,
        project_id=project.pk if project else None,
        project_slug=project.slug if project else None,
        days=days,
        viewer_principals=user_principals(request.user, tenant_id),
    )
    context = {
        "analytics": analytics,
        "charts": _analytics_charts(analytics),
        "projects": projects,
        "project": project,
        "days": days,
        "day_choices": [7, 30, 90],
    }
    return render(request, "search/analytics.html", context)
