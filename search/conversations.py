"""Conversations and shared answers: the reads and writes around ``Conversation`` and
``AnswerRecord`` that every surface uses (the ask pipeline itself is ``search.services``).

- A conversation is its user's alone: every function takes the acting user and answers
  ``ConversationNotFound`` for anyone else's (another user's, another tenant's: the same). It
  lives in one project: a follow-up asked in another project is not one of its turns.
- An answer is *readable* by a user who may read its project now and every document it cited
  or showed as evidence (the documents a who-knows person block names included). A shared
  answer (``/answers/<id>/``) opens only when readable, else ``SharedAnswerNotFound`` (a 404),
  so a link never tells who may not read it that it exists; a reopened conversation shows each
  turn's answer only when readable (a turn whose project or documents the user lost shows its
  question and a note), and only readable turns inform a follow-up's rewrite.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db.models import Count
from django.utils.dateparse import parse_datetime

from kbportal.audit import audit_record
from kbportal.tenancy import tenant_context
from projects.models import Project
from projects.selectors import ScopeNotFound, project_get_for_user, project_source_ids, user_tenant_id
from search.models import AnswerRecord, Conversation
from search.pipeline.followup import Turn
from sources.models import Document
from sources.selectors import QueryScope, user_principals

HISTORY_RECORDS = 5  # earlier turns read for a follow-up (the rewrite looks at fewer)
CONVERSATIONS_LISTED = 100  # a user's most recent conversations on the list page and the API


class ConversationNotFound(LookupError):
    """No conversation with that id that this user holds (-> 404)."""


class SharedAnswerNotFound(LookupError):
    """No answer with that id that this user may read (-> 404)."""


def _uuid(value: str | uuid.UUID, error: type[LookupError]) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError as exc:
        raise error("no such id") from exc


def conversation_for_ask(scope: QueryScope, conversation_id: str | uuid.UUID) -> tuple[Conversation, list[Turn]]:
    """The scope user's conversation ``conversation_id`` and its last turns asked in the scope's
    project (oldest first), for a follow-up. Raises ``ConversationNotFound`` for an id that is
    not a conversation of this user in this tenant."""
    public_id = _uuid(conversation_id, ConversationNotFound)
    if scope.user_id is None:
        raise ConversationNotFound("no such conversation")
    with tenant_context(scope.tenant_id, user_id=scope.user_id):
        conversation = Conversation.objects.filter(public_id=public_id, user_id=scope.user_id).first()
        if conversation is None:
            raise ConversationNotFound("no such conversation")
        if conversation.project_id != scope.project_id:
            raise ConversationNotFound(f"this conversation is in another project than {scope.project_slug!r}")
        records = list(
            AnswerRecord.objects.filter(conversation=conversation, project_id=scope.project_id).order_by("-created_at")[
                :HISTORY_RECORDS
            ]
        )
    readable = readable_record_ids(scope.user_id, scope.tenant_id, records)
    turns = [
        Turn(question=r.question, standalone=r.standalone_question or r.question, answer=r.answer)
        for r in records
        if r.pk in readable
    ]
    return conversation, turns[::-1]


def document_access(tenant_id: int, user_id: int | None, document_ids: set[int]) -> dict[int, dict[str, Any]]:
    """``{pk: {"source_id", "principals", "content_hash"}}`` of those of ``document_ids`` still
    there, read in one query in the tenant's context (for :func:`documents_readable`)."""
    if not document_ids:
        return {}
    with tenant_context(tenant_id, user_id=user_id):
        rows = Document.objects.filter(pk__in=document_ids).values("pk", "source_id", "principals", "content_hash")
        return {row.pop("pk"): row for row in rows}


def documents_readable(
    access: dict[int, dict[str, Any]], document_ids: set[int], *, allowed_sources: set[int], principals: set[str]
) -> bool:
    """Whether every one of ``document_ids`` is in ``access`` (:func:`document_access`: still
    there), sits in one of ``allowed_sources`` and has no principals or one of ``principals``:
    the one rule for showing again what an answer used (share links, reopened turns, reviews,
    verified answers). A document deleted since cannot be checked, so it fails closed."""
    return all(
        pk in access
        and access[pk]["source_id"] in allowed_sources
        and (not access[pk]["principals"] or bool(principals.intersection(access[pk]["principals"])))
        for pk in document_ids
    )


def readable_record_ids(user_or_id, tenant_id: int, records: list[AnswerRecord]) -> set[int]:
    """The pks of ``records`` (of ``tenant_id``) whose answers the user (a user or a user id)
    may read now (module docstring): project readable, every cited or shown document readable
    in it. A document deleted since cannot be checked, so it counts as unreadable."""
    from django.contrib.auth import get_user_model

    user = user_or_id if hasattr(user_or_id, "pk") else get_user_model().objects.get(pk=user_or_id)
    sources_by_project: dict[int, set[int] | None] = {}
    for project_id in {r.project_id for r in records if r.project_id is not None}:
        with tenant_context(tenant_id, user_id=user.pk):
            project = Project.objects.filter(pk=project_id).first()
        try:
            if project is None:
                raise ScopeNotFound("no such project")
            project_get_for_user(user, project.slug, tenant_id=tenant_id)
            sources_by_project[project_id] = set(project_source_ids(project))
        except ScopeNotFound:
            sources_by_project[project_id] = None
    principals = set(user_principals(user, tenant_id))
    used = {r.pk: set(r.cited_document_ids) | set(r.evidence_document_ids) for r in records}
    access = document_access(tenant_id, user.pk, set().union(*used.values()) if used else set())
    readable = set()
    for record in records:
        allowed = sources_by_project.get(record.project_id) if record.project_id is not None else None
        if allowed is not None and documents_readable(
            access, used[record.pk], allowed_sources=allowed, principals=principals
        ):
            readable.add(record.pk)
    return readable


def conversation_start(scope: QueryScope, question: str) -> Conversation:
    """A new conversation of the scope's user in its project, titled by ``question``."""
    with tenant_context(scope.tenant_id, user_id=scope.user_id):
        return Conversation.objects.create(
            tenant_id=scope.tenant_id,
            user_id=scope.user_id,
            project_id=scope.project_id,
            title=" ".join(question.split())[: Conversation.TITLE_CHARS],
        )


@dataclass(frozen=True)
class ConversationListing:
    """One line of a user's conversation list: ``id`` (public UUID as text), title, project slug
    (blank when the project is gone), number of turns, last activity."""

    id: str
    title: str
    project: str
    turns: int
    updated_at: Any

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "project": self.project,
            "turns": self.turns,
            "updated_at": self.updated_at.isoformat(),
        }


def _tenant(user, tenant_id: int | None) -> int | None:
    return tenant_id if tenant_id is not None else user_tenant_id(user)


def conversation_list_for_user(
    user, *, tenant_id: int | None = None, project_id: int | None = None, limit: int = CONVERSATIONS_LISTED
) -> list[ConversationListing]:
    """``user``'s conversations in ``tenant_id`` (default: the tenant they work in), most
    recently active first; with ``project_id``, only that project's (a token pinned to it)."""
    tenant_id = _tenant(user, tenant_id)
    if tenant_id is None:
        return []
    with tenant_context(tenant_id, user_id=user.pk):
        conversations = Conversation.objects.filter(user=user)
        if project_id is not None:
            conversations = conversations.filter(project_id=project_id)
        rows = conversations.annotate(n_turns=Count("turns")).select_related("project").order_by("-updated_at")[:limit]
        return [
            ConversationListing(
                id=str(c.public_id),
                title=c.title,
                project=c.project.slug if c.project else "",
                turns=c.n_turns,
                updated_at=c.updated_at,
            )
            for c in rows
        ]


@dataclass(frozen=True)
class ConversationTurn:
    """One turn as shown again: the stored answer record's fields."""

    answer_id: str
    question: str
    standalone_question: str
    rewrite_method: str
    answer: str
    answered: bool
    sources: list[dict[str, Any]]
    created_at: Any
    readable: bool = True  # False: the answer is withheld (its project or a document it used is no longer readable)

    def as_dict(self) -> dict[str, Any]:
        return {
            "answer_id": self.answer_id,
            "question": self.question,
            "standalone_question": self.standalone_question or self.question,
            "rewrite_method": self.rewrite_method or "none",
            "answer": self.answer,
            "answered": self.answered,
            "sources": self.sources,
            "created_at": self.created_at.isoformat(),
            "readable": self.readable,
        }


def stored_sources(sources: list[Any]) -> list[dict[str, Any]]:
    """Stored cited sources (``AnswerRecord.cited_sources``) as shown again: each a dict, its
    ``updated_at`` a datetime again (``None`` when absent)."""
    return [
        {**s, "updated_at": parse_datetime(s["updated_at"]) if isinstance(s.get("updated_at"), str) else None}
        for s in sources or []
        if isinstance(s, dict)
    ]


WITHHELD = "This answer is no longer shown: it used a project or document you may not read now."


def _turn(record: AnswerRecord, *, readable: bool = True) -> ConversationTurn:
    if not readable:
        return ConversationTurn(
            answer_id=str(record.public_id),
            question=record.question,
            standalone_question=record.standalone_question,
            rewrite_method=record.rewrite_method,
            answer=WITHHELD,
            answered=False,
            sources=[],
            created_at=record.created_at,
            readable=False,
        )
    return ConversationTurn(
        answer_id=str(record.public_id),
        question=record.question,
        standalone_question=record.standalone_question,
        rewrite_method=record.rewrite_method,
        answer=record.answer,
        answered=record.answered,
        sources=stored_sources(record.cited_sources),
        created_at=record.created_at,
    )


def _conversation(user, public_id: uuid.UUID, project_id: int | None) -> Conversation:
    """Inside the tenant's context: ``user``'s conversation (in ``project_id`` when given)."""
    conversations = Conversation.objects.filter(public_id=public_id, user=user)
    if project_id is not None:
        conversations = conversations.filter(project_id=project_id)
    conversation = conversations.select_related("project").first()
    if conversation is None:
        raise ConversationNotFound("no such conversation")
    return conversation


def conversation_get_for_user(
    user, conversation_id: str | uuid.UUID, *, tenant_id: int | None = None, project_id: int | None = None
) -> tuple[ConversationListing, list[ConversationTurn]]:
    """``user``'s conversation in ``tenant_id`` (default: the tenant they work in; with
    ``project_id``, only if in that project) and its turns, oldest first, each answer withheld
    unless readable now (module docstring). Raises ``ConversationNotFound``."""
    public_id = _uuid(conversation_id, ConversationNotFound)
    tenant_id = _tenant(user, tenant_id)
    if tenant_id is None:
        raise ConversationNotFound("no such conversation")
    with tenant_context(tenant_id, user_id=user.pk):
        conversation = _conversation(user, public_id, project_id)
        records = list(AnswerRecord.objects.filter(conversation=conversation).order_by("created_at"))
    readable = readable_record_ids(user, tenant_id, records)
    listing = ConversationListing(
        id=str(conversation.public_id),
        title=conversation.title,
        project=conversation.project.slug if conversation.project else "",
        turns=len(records),
        updated_at=conversation.updated_at,
    )
    return listing, [_turn(r, readable=r.pk in readable) for r in records]


def conversation_delete(
    actor, conversation_id: str | uuid.UUID, *, tenant_id: int | None = None, project_id: int | None = None
) -> None:
    """Delete ``actor``'s conversation in ``tenant_id`` (default: the tenant they work in; with
    ``project_id``, only if in that project; its answers stay, detached, for analytics and the
    audit log) and write the ``conversation.delete`` audit event. Raises ``ConversationNotFound``."""
    public_id = _uuid(conversation_id, ConversationNotFound)
    tenant_id = _tenant(actor, tenant_id)
    if tenant_id is None:
        raise ConversationNotFound("no such conversation")
    with tenant_context(tenant_id, user_id=actor.pk):
        conversation = _conversation(actor, public_id, project_id)
        audit_record(
            action="conversation.delete",
            tenant_id=tenant_id,
            actor=actor,
            object_type="search.conversation",
            object_id=conversation.pk,
            data={"conversation_id": str(conversation.public_id), "title": conversation.title},
        )
        conversation.delete()


def shared_answer_get_for_user(user, answer_id: str | uuid.UUID) -> tuple[ConversationTurn, str]:
    """The answer ``answer_id`` and its project's slug, if it is in ``user``'s tenant and readable
    by them (:func:`readable_record_ids`: its project, and every document it cited or showed).
    Raises ``SharedAnswerNotFound``."""
    public_id = _uuid(answer_id, SharedAnswerNotFound)
    tenant_id = user_tenant_id(user)
    if tenant_id is None:
        raise SharedAnswerNotFound("no such answer")
    with tenant_context(tenant_id, user_id=user.pk):
        record = AnswerRecord.objects.filter(public_id=public_id).select_related("project").first()
    if record is None or record.project is None or record.pk not in readable_record_ids(user, tenant_id, [record]):
        raise SharedAnswerNotFound("no such answer")
    return _turn(record), record.project.slug
