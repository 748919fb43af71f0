"""The review list: thumbs-down with a comment, reviewed by the organization's admins, exported
as evaluation cases.

- :func:`review_list`: the tenant's thumbs-down votes that carry a comment, unreviewed first,
  each with the documents its answer showed (titles only of those the reviewer may read). An
  answer the reviewer may not read (``search.conversations.readable_record_ids``: its project,
  or a document it cited or showed, is closed to them) is listed by its question and comment
  only: its text, expected answer and documents stay hidden, and only a reviewer who may read
  it can review it.
- :func:`review_submit`: an admin records which of those documents answer the question, or that
  the sources do not answer it, and optionally what the answer should say.
- :func:`review_export_lines`: every reviewed case the exporter may read as one ``kb_eval`` question line
  (``search.evaluation.load_questions`` reads it): ``{"id", "type", "question", "gold",
  "answer_facts"}``, ``gold`` as ``{"kind": "doc_id", "id": <external id>}`` items, ``type``
  ``unanswerable`` when the sources do not answer it, else ``feedback``.

The caller (a view) checks that the reader is an owner or admin of the tenant.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db.models import F
from django.utils import timezone

from kbportal.audit import audit_record
from kbportal.tenancy import tenant_context
from search.conversations import readable_record_ids
from search.models import AnswerFeedback
from sources.models import Document
from sources.selectors import user_principals

REVIEWS_LISTED = 200
EXPECTED_ANSWER_CHARS = 4000


class ReviewNotFound(LookupError):
    """No thumbs-down with a comment with that id in the tenant (-> 404)."""


@dataclass(frozen=True)
class ReviewDocument:
    """A document the reviewed answer showed: ``title`` blank when the reviewer may not read it."""

    id: int
    title: str
    readable: bool


@dataclass(frozen=True)
class ReviewItem:
    """One thumbs-down; ``readable`` false: the reviewer may not read its answer (shown by its
    question and comment only, and not reviewable by them)."""

    feedback: AnswerFeedback
    documents: list[ReviewDocument]
    readable: bool = True


def _queryset():
    return AnswerFeedback.objects.filter(vote=AnswerFeedback.Vote.DOWN).exclude(comment="")


def review_list(*, tenant_id: int, reviewer) -> list[ReviewItem]:
    """The tenant's thumbs-down with a comment (at most ``REVIEWS_LISTED``), unreviewed first,
    newest first within each, with the documents each answer showed as evidence."""
    with tenant_context(tenant_id):
        feedback = list(
            _queryset()
            .select_related("answer_record", "reviewed_by", "user")
            .order_by(F("reviewed_at").asc(nulls_first=True), "-created_at")[:REVIEWS_LISTED]
        )
        ids = {i for f in feedback for i in (f.answer_record.evidence_document_ids if f.answer_record else [])}
        rows = {d["pk"]: d for d in Document.objects.filter(pk__in=ids).values("pk", "title", "principals")}
    readable_records = readable_record_ids(reviewer, tenant_id, [f.answer_record for f in feedback])
    principals = set(user_principals(reviewer, tenant_id))
    items = []
    for f in feedback:
        if f.answer_record_id not in readable_records:
            items.append(ReviewItem(feedback=f, documents=[], readable=False))
            continue
        documents = []
        for pk in dict.fromkeys(f.answer_record.evidence_document_ids if f.answer_record else []):
            row = rows.get(pk)
            if row is None:
                continue
            readable = not row["principals"] or bool(principals.intersection(row["principals"]))
            documents.append(ReviewDocument(id=pk, title=row["title"] if readable else "", readable=readable))
        items.append(ReviewItem(feedback=f, documents=documents))
    return items


def review_submit(
    *,
    tenant_id: int,
    reviewer,
    feedback_id: int,
    document_ids: list[int],
    unanswerable: bool,
    expected_answer: str = "",
) -> AnswerFeedback:
    """Record ``reviewer``'s review of the thumbs-down ``feedback_id``: the documents (among those
    its answer showed, and readable by the reviewer) that answer it, or ``unanswerable``. Raises
    ``ReviewNotFound``, and ``ValueError`` for both or neither of documents and unanswerable.
    Writes ``feedback.review`` in the same transaction. An answer the reviewer may not read is
    ``ReviewNotFound`` too (module docstring)."""
    with tenant_context(tenant_id):
        feedback = _queryset().filter(pk=feedback_id).select_related("answer_record").first()
    if feedback is None or feedback.answer_record_id not in readable_record_ids(
        reviewer, tenant_id, [feedback.answer_record]
    ):
        raise ReviewNotFound("no such review")
    principals = set(user_principals(reviewer, tenant_id))
    shown = set(feedback.answer_record.evidence_document_ids if feedback.answer_record else [])
    with tenant_context(tenant_id):
        readable = {
            d["pk"]
            for d in Document.objects.filter(pk__in=shown).values("pk", "principals")
            if not d["principals"] or principals.intersection(d["principals"])
        }
    chosen = [i for i in dict.fromkeys(document_ids) if i in readable]
    if unanswerable == bool(chosen):
        raise ValueError("choose the documents that answer the question, or say the sources do not answer it")
    with tenant_context(tenant_id):
        feedback.reviewed_at = timezone.now()
        feedback.reviewed_by = reviewer
        feedback.expected_document_ids = chosen
        feedback.unanswerable = unanswerable
        feedback.expected_answer = (expected_answer or "").replace("\x00", "").strip()[:EXPECTED_ANSWER_CHARS]
        feedback.save(
            update_fields=["reviewed_at", "reviewed_by", "expected_document_ids", "unanswerable", "expected_answer"]
        )
        audit_record(
            action="feedback.review",
            tenant_id=tenant_id,
            actor=reviewer,
            object_type="search.answerfeedback",
            object_id=feedback.pk,
            data={"question": feedback.question, "documents": chosen, "unanswerable": unanswerable},
        )
    return feedback


def review_export_lines(*, tenant_id: int, exporter) -> Iterator[str]:
    """Each reviewed case whose answer ``exporter`` may read (its gold documents are among those
    it showed) as one JSON line in the ``kb_eval`` question format (module docstring)."""
    with tenant_context(tenant_id):
        reviewed = list(_queryset().exclude(reviewed_at=None).select_related("answer_record").order_by("pk"))
    readable = readable_record_ids(exporter, tenant_id, [f.answer_record for f in reviewed])
    reviewed = [f for f in reviewed if f.answer_record_id in readable]
    with tenant_context(tenant_id):
        ids = {i for f in reviewed for i in f.expected_document_ids}
        external = dict(Document.objects.filter(pk__in=ids).values_list("pk", "external_id"))
    for f in reviewed:
        case: dict[str, Any] = {
            "id": f"feedback-{f.pk}",
            "type": "unanswerable" if f.unanswerable else "feedback",
            "question": f.question,
            "gold": [{"kind": "doc_id", "id": external[i]} for i in f.expected_document_ids if i in external],
        }
        if f.expected_answer:
            case["answer_facts"] = [f.expected_answer]
        yield json.dumps(case, ensure_ascii=False) + "\n"
