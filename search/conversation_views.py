"""Web pages for conversations and shared answers: the user's conversation list (reopen,
delete), an answer's share link, and marking an answer verified. Logic lives in
``search.conversations`` and ``search.verified``."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from search.conversations import (
    ConversationNotFound,
    SharedAnswerNotFound,
    conversation_delete,
    conversation_list_for_user,
    shared_answer_get_for_user,
)
from search.rendering import answer_html
from search.verified import (
    VerifiedNotFound,
    VerifyForbidden,
    answer_verifiable,
    answer_verify,
    verified_for_answer,
)


@login_required
@require_GET
def conversation_list_page(request: HttpRequest) -> HttpResponse:
    """``/conversations/``: the user's conversations in their organization, most recent first,
    each reopening on the ask page, with a delete button."""
    return render(request, "search/conversations.html", {"conversations": conversation_list_for_user(request.user)})


@login_required
@require_POST
def conversation_delete_view(request: HttpRequest, conversation_id) -> HttpResponse:
    """``POST /conversations/<uuid>/delete`` (CSRF-checked): delete one of the user's
    conversations; anyone else's is 404."""
    try:
        conversation_delete(request.user, conversation_id)
    except ConversationNotFound:
        return render(request, "search/not_found.html", {"message": "no such conversation"}, status=404)
    messages.success(request, "The conversation was deleted.")
    return redirect("search:conversations")


@login_required
@require_GET
def shared_answer_page(request: HttpRequest, answer_id) -> HttpResponse:
    """``/answers/<uuid>/``: an answer as it was given, with its cited sources, for anyone who may
    read every document it cites or showed (``search.conversations.shared_answer_get_for_user``);
    404 for everyone else, whether or not the answer exists."""
    try:
        turn, project = shared_answer_get_for_user(request.user, answer_id)
    except SharedAnswerNotFound:
        return render(request, "search/not_found.html", {"message": "no such answer"}, status=404)
    html = answer_html(turn.answer, [s["n"] for s in turn.sources if isinstance(s.get("n"), int)])
    verified = verified_for_answer(request.user, answer_id)
    context = {
        "turn": turn,
        "answer_html": html,
        "project": project,
        "may_verify": answer_verifiable(request.user, answer_id),
        "verified": verified,
        "verified_html": answer_html(verified.text, [s["n"] for s in turn.sources], anchor="source-")
        if verified is not None
        else "",
    }
    return render(request, "search/shared_answer.html", context)


@login_required
@require_POST
def answer_verify_view(request: HttpRequest, answer_id) -> HttpResponse:
    """``POST /answers/<uuid>/verify`` (``text``: the answer as verified, blank for as given;
    CSRF-checked): an owner or admin of the organization, or an editor of the answer's project,
    marks it verified (403 for other readers, 404 for anyone who may not read it)."""
    try:
        answer_verify(actor=request.user, answer_id=answer_id, text=request.POST.get("text", ""))
    except VerifiedNotFound:
        return render(request, "search/not_found.html", {"message": "no such answer"}, status=404)
    except VerifyForbidden as exc:
        return HttpResponse(str(exc), status=403, content_type="text/plain")
    messages.success(request, "The answer is verified: it is shown first to anyone asking the same question.")
    return redirect("search:shared_answer", answer_id=answer_id)
