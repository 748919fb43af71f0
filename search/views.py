"""Web pages: ask (cited answer + sources, streamed over server-sent events), search (ranked
hits), who knows (people for a topic), answer feedback. Logic lives in services and tools."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.utils.html import escape
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET, require_POST

from projects.selectors import ScopeNotFound, project_list_for_user
from search.retrieval import EmptyQuery, clean_query, hybrid_search, safe_link
from search.services import AnswerNotFound, AskEvent, answer_feedback_submit, ask, ask_stream
from sources.selectors import DocumentNotFound, document_get_for_user, scope_for_user

logger = logging.getLogger(__name__)

_SLUG = re.compile(r"[-a-zA-Z0-9_]{1,80}")


def _scope_or_onboarding(request: HttpRequest):
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


def _link_citations(text: str) -> str:
    """Escape the answer, then turn ``[n]`` (already validated) into links to the source list."""
    html = escape(text)
    html = re.sub(r"\[(\d+)\]", lambda m: f'<a class="cite" href="#source-{m.group(1)}">[{m.group(1)}]</a>', html)
    return mark_safe(html.replace("\n", "<br>"))


@login_required
def ask_page(request: HttpRequest) -> HttpResponse:
    scope, response = _scope_or_onboarding(request)
    if response is not None:
        return response
    question = request.GET.get("q", "")
    context = {"scope": scope, "question": question, "projects": project_list_for_user(request.user)}
    if "q" in request.GET:
        try:
            result = ask(question, scope)
            context["result"] = result
            context["answer_html"] = _link_citations(result.answer.text)
        except EmptyQuery as exc:
            context["error"] = str(exc)
    return render(request, "search/ask.html", context)


def _server_sent_events(events: Iterator[AskEvent]) -> Iterator[str]:
    """Each event as ``event: <type>`` + ``data: <one-line JSON>``; a failure mid-way as a
    final ``failed`` event (not ``error``, which browsers' EventSource also uses for network errors)."""
    try:
        for event in events:
            yield f"event: {event.type}\ndata: {json.dumps(event.data, default=str)}\n\n"
    except Exception:
        logger.exception("the answer stream failed")
        yield 'event: failed\ndata: {"message": "the answer failed; please try again"}\n\n'


@login_required
@require_GET
def ask_stream_view(request: HttpRequest) -> HttpResponse:
    """``GET /ask/stream?q=...&project=...``: the answer as server-sent events (see ``AskEvent``).

    404 for a project the user may not use; 400 for a blank question.
    """
    scope, response = _scope_or_404(request)
    if response is not None:
        return response
    try:
        events = ask_stream(request.GET.get("q", ""), scope)
    except EmptyQuery as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain")
    response = StreamingHttpResponse(_server_sent_events(events), content_type="text/event-stream")
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
    context = {"scope": scope, "question": query, "projects": project_list_for_user(request.user)}
    if "q" in request.GET:
        from search.tools.people import who_knows

        try:
            context["experts"] = who_knows(query=clean_query(query), scope=scope, limit=10)
        except EmptyQuery as exc:
            context["error"] = str(exc)
    return render(request, "search/people.html", context)


@login_required
def search_page(request: HttpRequest) -> HttpResponse:
    scope, response = _scope_or_onboarding(request)
    if response is not None:
        return response
    query = request.GET.get("q", "")
    context = {"scope": scope, "question": query, "projects": project_list_for_user(request.user)}
    if "q" in request.GET:
        try:
            context["hits"] = hybrid_search(query, scope, limit=20).hits
        except EmptyQuery as exc:
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
