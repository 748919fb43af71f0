"""Web pages: ask (cited answer + sources) and search (ranked hits). Logic lives in services."""

from __future__ import annotations

import re

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.html import escape
from django.utils.safestring import mark_safe

from projects.selectors import ScopeNotFound, project_list_for_user
from search.retrieval import EmptyQuery, hybrid_search, safe_link
from search.services import ask
from sources.selectors import DocumentNotFound, document_get_for_user, scope_for_user

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
