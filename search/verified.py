"""Verified answers: an answer checked by someone who knows, shown first to later askers.

- :func:`answer_verify`: an owner or admin of the organization, or an editor of the answer's
  project, marks an answer verified (optionally editing its text first). It must be an answer
  they may read (``search.conversations.readable_record_ids``). Verifying again replaces it.
- :func:`verified_answer_match`: for a question asked in a project, the verified answer of that
  project whose question means the same (:func:`same_question`), best first. Shown only to an
  asker who may read every document it cited or showed, each still there (its source in the
  asker's scope, its principals empty or naming them: a deleted one fails closed). It is
  *stale* when a cited document changed (another ``content_hash``) or is gone since it was
  asked.

"Means the same" is two tests, both needed. The cosine similarity of the questions' embeddings
is at least ``VERIFIED_MATCH_SIMILARITY`` = 0.90, chosen with ``bench/verified_match.py``: over
21,503 pairs of different FastAPI questions about different pages, the most similar pair
reached 0.870 and none 0.90. And the two ask with the same words: the same content-word stems
(``search.text.content_terms``) and the same negations. An embedding puts "increase the
timeout" and "decrease the timeout" at 0.97, "Is the VPN required...?" and "...not required?"
at 0.99: a verified answer to one must not be shown as the answer to the other.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from dataclasses import dataclass
from typing import Any

from kbportal.audit import audit_record
from kbportal.tenancy import tenant_context
from projects.selectors import project_can_edit, user_is_tenant_admin, user_tenant_id
from search.conversations import document_access, documents_readable, readable_record_ids, stored_sources
from search.models import AnswerRecord, VerifiedAnswer
from search.text import WORD, content_terms
from sources.models import Document
from sources.selectors import QueryScope

VERIFIED_MATCH_SIMILARITY = 0.90


class VerifyForbidden(PermissionError):
    """The actor may read the answer but may not verify it (not an admin, not an editor)."""


class VerifiedNotFound(LookupError):
    """No answer with that id that the actor may read (-> 404)."""


NEGATIONS = frozenset("not no never none nothing without cannot cant dont doesnt isnt arent wont nor".split())


def _question_words(question: str) -> tuple[frozenset[str], frozenset[str]]:
    """``(content-word stems, negations)`` of a question; "can't" and "don't" count as negations."""
    words = {w.lower().replace("'", "").replace("’", "") for w in WORD.findall(question.replace("n't", " not"))}
    return frozenset(content_terms(question)), frozenset(words & NEGATIONS)


def same_question(asked: str, verified: str, similarity: float) -> bool:
    """Whether ``asked`` means the same as ``verified`` (module docstring)."""
    return similarity >= VERIFIED_MATCH_SIMILARITY and _question_words(asked) == _question_words(verified)


def _embedding(text: str) -> list[float]:
    from sources.embeddings import get_embedder

    return [float(x) for x in get_embedder().embed_query(text)]


def _cosine(a: list[float], b: list[float]) -> float:
    if not a or not b or len(a) != len(b):
        return 0.0
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def answer_may_verify(user, record: AnswerRecord) -> bool:
    """Whether ``user`` may verify ``record``: an owner or admin of its tenant, or an editor of its project."""
    if getattr(user, "pk", None) is None or record.project_id is None:
        return False
    if user_is_tenant_admin(user, record.tenant_id):
        return True
    with tenant_context(record.tenant_id, user_id=user.pk):
        return project_can_edit(user_id=user.pk, project_ids=[record.project_id])


def verified_for_answer(user, answer_id: str | uuid.UUID) -> VerifiedAnswer | None:
    """The verification of the answer ``answer_id`` in ``user``'s organization, if any (the
    caller has checked that they may read the answer), with ``verified_by`` loaded."""
    tenant_id = user_tenant_id(user)
    if tenant_id is None:
        return None
    with tenant_context(tenant_id, user_id=user.pk):
        return VerifiedAnswer.objects.filter(answer_record__public_id=answer_id).select_related("verified_by").first()


def answer_verifiable(user, answer_id: str | uuid.UUID) -> bool:
    """Whether ``user`` may verify the answer ``answer_id`` of their organization (the caller has
    checked that they may read it)."""
    tenant_id = user_tenant_id(user)
    if tenant_id is None:
        return False
    with tenant_context(tenant_id, user_id=user.pk):
        record = AnswerRecord.objects.filter(public_id=answer_id).first()
    return record is not None and answer_may_verify(user, record)


def answer_verify(*, actor, answer_id: str | uuid.UUID, text: str | None = None) -> VerifiedAnswer:
    """Mark the answer ``answer_id`` verified by ``actor``, with ``text`` (blank: the answer as
    given; cut to ``VerifiedAnswer.TEXT_CHARS``). Raises ``VerifiedNotFound`` for an answer not
    in the actor's organization or not readable by them, ``VerifyForbidden`` when they may not
    verify. Writes the ``answer.verify`` audit event in the same transaction."""
    try:
        public_id = uuid.UUID(str(answer_id))
    except ValueError as exc:
        raise VerifiedNotFound("no such answer") from exc
    tenant_id = user_tenant_id(actor)
    if tenant_id is None:
        raise VerifiedNotFound("no such answer")
    with tenant_context(tenant_id, user_id=actor.pk):
        record = AnswerRecord.objects.filter(public_id=public_id).first()
    if record is None or record.pk not in readable_record_ids(actor, tenant_id, [record]):
        raise VerifiedNotFound("no such answer")
    if not answer_may_verify(actor, record):
        raise VerifyForbidden("only an owner or admin of the organization, or an editor of the project, may verify")
    body = (text or "").replace("\x00", "").strip()[: VerifiedAnswer.TEXT_CHARS] or record.answer
    question = record.standalone_question or record.question
    embedding = _embedding(question)
    with tenant_context(tenant_id, user_id=actor.pk):
        # A document re-indexed since the question was asked may no longer say what the answer
        # quotes: its hash is recorded as changed, so the verified answer starts out stale.
        hashes = {
            str(pk): content_hash if indexed_at is None or indexed_at <= record.created_at else "changed-before-verify"
            for pk, content_hash, indexed_at in Document.objects.filter(pk__in=record.cited_document_ids).values_list(
                "pk", "content_hash", "indexed_at"
            )
        }
        previous = VerifiedAnswer.objects.filter(answer_record=record).select_related("verified_by").first()
        verified, _ = VerifiedAnswer.objects.update_or_create(
            answer_record=record,
            defaults={
                "tenant_id": tenant_id,
                "project_id": record.project_id,
                "question": question,
                "question_embedding": embedding,
                "text": body,
                "cited_sources": record.cited_sources,
                "cited_document_ids": record.cited_document_ids,
                "shown_document_ids": sorted(set(record.cited_document_ids) | set(record.evidence_document_ids)),
                "document_hashes": hashes,
                "verified_by": actor,
            },
        )
        audit_record(
            action="answer.verify",
            tenant_id=tenant_id,
            actor=actor,
            object_type="search.verifiedanswer",
            object_id=verified.pk,
            data={
                "answer_id": str(record.public_id),
                "question": question,
                "edited": body != record.answer,
                "text_sha256": hashlib.sha256(body.encode()).hexdigest(),
                "replaced": (
                    {
                        "verified_by": previous.verified_by.get_username() if previous.verified_by else None,
                        "text_sha256": hashlib.sha256(previous.text.encode()).hexdigest(),
                    }
                    if previous is not None
                    else None
                ),
            },
        )
    return verified


@dataclass(frozen=True)
class VerifiedMatch:
    """A verified answer shown beside a fresh one: ``similarity`` (cosine, 0..1) of the questions;
    ``stale`` when a document it cites changed or is gone; ``sources`` as shown when verified."""

    id: str
    question: str
    text: str
    verified_by: str
    verified_at: Any
    stale: bool
    similarity: float
    sources: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "question": self.question,
            "text": self.text,
            "verified_by": self.verified_by,
            "verified_at": self.verified_at.isoformat(),
            "stale": self.stale,
            "similarity": round(self.similarity, 4),
            "sources": [
                {**s, "updated_at": s["updated_at"].isoformat() if s.get("updated_at") else None} for s in self.sources
            ],
        }


def verified_answer_match(question: str, scope: QueryScope) -> VerifiedMatch | None:
    """The verified answer of the scope's project for ``question`` (module docstring), or ``None``."""
    with tenant_context(scope.tenant_id, user_id=scope.user_id):
        candidates = list(VerifiedAnswer.objects.filter(project_id=scope.project_id).select_related("verified_by"))
    if not candidates:
        return None
    vector = _embedding(question)
    scored = sorted(
        ((_cosine(vector, c.question_embedding), c) for c in candidates), key=lambda pair: pair[0], reverse=True
    )
    allowed, principals = set(scope.allowed_source_ids), set(scope.principals)
    for similarity, verified in scored:
        if similarity < VERIFIED_MATCH_SIMILARITY:
            return None
        if not same_question(question, verified.question, similarity):
            continue
        needed = set(verified.shown_document_ids) | set(verified.cited_document_ids)
        access = document_access(scope.tenant_id, scope.user_id, needed)
        if not documents_readable(access, needed, allowed_sources=allowed, principals=principals):
            continue  # an answer using what this asker may not read (or what is gone) is not theirs to see
        stale = any(
            access[pk]["content_hash"] != verified.document_hashes.get(str(pk)) for pk in verified.cited_document_ids
        )
        sources = stored_sources(verified.cited_sources)
        return VerifiedMatch(
            id=str(verified.public_id),
            question=verified.question,
            text=verified.text,
            verified_by=verified.verified_by.get_username() if verified.verified_by else "a former member",
            verified_at=verified.verified_at,
            stale=stale,
            similarity=similarity,
            sources=sources,
        )
    return None
