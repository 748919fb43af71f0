"""The review list of thumbs-down for the organization's admins, and its export as evaluation
cases. Logic lives in ``search.reviews``."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods

from projects.selectors import user_is_tenant_admin, user_tenant_id
from search.reviews import ReviewNotFound, review_export_lines, review_list, review_submit


def _admin_tenant(request: HttpRequest) -> int | None:
    tenant_id = user_tenant_id(request.user)
    if tenant_id is None or not user_is_tenant_admin(request.user, tenant_id):
        return None
    return tenant_id


@login_required
@require_http_methods(["GET", "POST"])
def review_page(request: HttpRequest) -> HttpResponse:
    """``/reviews/``: thumbs-down with a comment, unreviewed first; POST (``feedback``,
    ``documents``, ``unanswerable``, ``expected_answer``; CSRF-checked) records a review.
    Owners and admins only (404 for anyone else)."""
    tenant_id = _admin_tenant(request)
    if tenant_id is None:
        return render(request, "search/not_found.html", {"message": "no such page"}, status=404)
    if request.method == "POST":
        feedback_id = request.POST.get("feedback", "")
        if not (feedback_id.isascii() and feedback_id.isdigit() and len(feedback_id) <= 18):
            return render(request, "search/not_found.html", {"message": "no such review"}, status=404)
        documents = request.POST.getlist("documents")
        try:
            review_submit(
                tenant_id=tenant_id,
                reviewer=request.user,
                feedback_id=int(feedback_id),
                document_ids=[int(v) for v in documents if v.isascii() and v.isdigit() and len(v) <= 18],
                unanswerable=request.POST.get("unanswerable") == "1",
                expected_answer=request.POST.get("expected_answer", ""),
            )
        except ReviewNotFound:
            return render(request, "search/not_found.html", {"message": "no such review"}, status=404)
        except ValueError as exc:  # neither documents nor "unanswerable", or both
            messages.error(request, str(exc))
        else:
            messages.success(request, "Review recorded; it is in the export.")
        return redirect("search:reviews")
    items = review_list(tenant_id=tenant_id, reviewer=request.user)
    return render(request, "search/reviews.html", {"items": items})


@login_required
@require_GET
def review_export(request: HttpRequest) -> HttpResponseBase:
    """``/reviews/export.jsonl``: the reviewed cases in the ``kb_eval`` question format."""
    tenant_id = _admin_tenant(request)
    if tenant_id is None:
        return render(request, "search/not_found.html", {"message": "no such page"}, status=404)
    response = StreamingHttpResponse(
        review_export_lines(tenant_id=tenant_id, exporter=request.user), content_type="application/x-ndjson"
    )
    response["Content-Disposition"] = 'attachment; filename="kbportal-reviewed-questions.jsonl"'
    return response
