"""Asked questions with the answers they got, the conversations they belong to, and the askers'
feedback on them."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models

from kbportal.tenancy import TenantOwned


class Conversation(TenantOwned):
    """One user's conversation with the portal: answers asked in turn, each follow-up answered with
    the earlier turns in mind (``search.pipeline.followup``). Only its user sees it.

    ``public_id`` is its id in URLs and the API; ``title`` the first question (cut to 200
    characters); ``updated_at`` moves with every turn. Deleting it detaches its answers, which
    stay in analytics and the audit log. ``slack_thread`` (``<channel>:<thread ts>``) is the
    Slack thread it is held in when asked of the Slack bot (``search.slack_bot``), else blank.
    """

    TITLE_CHARS = 200
    SLACK_THREAD_CHARS = 64

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey("projects.Project", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    title = models.CharField(max_length=TITLE_CHARS)
    slack_thread = models.CharField(max_length=SLACK_THREAD_CHARS, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [
            models.Index(fields=["tenant", "user", "updated_at"], name="conversation_user_updated"),
            models.Index(fields=["tenant", "slack_thread"], name="conversation_slack_thread"),
        ]

    def __str__(self) -> str:
        return self.title[:80]


class AnswerRecord(TenantOwned):
    """One question asked on any surface and the answer it got; feedback attaches to it.

    ``public_id`` is the answer's id in URLs. ``conversation`` is the conversation it is a turn
    of (none: asked on its own); ``standalone_question`` what the pipeline answered when the
    question was rewritten with the earlier turns in mind (``rewrite_method`` ``rules`` or
    ``llm``), else blank. ``evidence_document_ids`` are the
    ``sources.Document`` ids shown as evidence, ``cited_document_ids`` those the answer cites
    (plain ids, not foreign keys: re-ingestion may delete a row, the record keeps its history);
    ``cited_sources`` the cited blocks as shown (``[{n, title, link, kind, location, updated_at,
    sections, text}]``, ``text`` cut to ``SOURCE_TEXT_CHARS``), to show the answer again.
    ``tools`` is the executor's report (``[{tool, query, rows, ms}]`` or ``{..., error}``).
    Times are milliseconds; ``first_token_ms`` is from the question to the first answer text.
    """

    SOURCE_TEXT_CHARS = 600

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    project = models.ForeignKey("projects.Project", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.SET_NULL, related_name="turns"
    )
    question = models.TextField()
    standalone_question = models.TextField(blank=True)
    rewrite_method = models.CharField(max_length=10, blank=True)
    answer = models.TextField(blank=True)
    answered = models.BooleanField()
    planner = models.CharField(max_length=20, blank=True)
    synthesizer = models.CharField(max_length=20, blank=True)
    tools = models.JSONField(default=list, blank=True)
    evidence_document_ids = ArrayField(models.BigIntegerField(), default=list, blank=True)
    cited_document_ids = ArrayField(models.BigIntegerField(), default=list, blank=True)
    cited_sources = models.JSONField(default=list, blank=True)
    latency_ms = models.FloatField()
    first_token_ms = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True, help_text="Why the LLM answer was replaced by the extractive one.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "created_at"], name="answerrecord_tenant_created")]

    def __str__(self) -> str:
        return self.question[:80]


class AnswerFeedback(TenantOwned):
    """The asker's thumbs up (+1) or down (-1) on an answer, with an optional comment.

    One vote per user and answer (voting again replaces it). The question, answer text, cited
    document ids and project are copied from the answer so the feedback reads on its own. A
    thumbs-down with a comment is reviewed by an admin (``reviewed_*``, ``expected_*``,
    ``unanswerable``) and then exports as an evaluation case (``search.reviews``).
    """

    class Vote(models.IntegerChoices):
        UP = 1, "Helpful"
        DOWN = -1, "Not helpful"

    answer_record = models.ForeignKey(AnswerRecord, on_delete=models.CASCADE, related_name="feedback")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey("projects.Project", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    question = models.TextField()
    answer = models.TextField(blank=True)
    cited_document_ids = ArrayField(models.BigIntegerField(), default=list, blank=True)
    vote = models.SmallIntegerField(choices=Vote.choices)
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # An admin's review of a thumbs-down (search.reviews): which documents answer the question
    # (ids), or that the sources do not answer it, and what the answer should say.
    reviewed_at = models.DateTimeField(null=True, blank=True)
    reviewed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    expected_document_ids = ArrayField(models.BigIntegerField(), default=list, blank=True)
    unanswerable = models.BooleanField(default=False)
    expected_answer = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["answer_record", "user"], name="answerfeedback_one_vote_per_user"),
            models.CheckConstraint(condition=models.Q(vote__in=[1, -1]), name="answerfeedback_vote_up_or_down"),
        ]

    def __str__(self) -> str:
        return f"{'+1' if self.vote > 0 else '-1'} on {self.answer_record_id}"


class SlackAnswer(TenantOwned):
    """A message the Slack bot posted (``channel``, ``ts``) and the answer it holds, so that a
    reaction on it becomes the asker's feedback (``search.slack_bot``)."""

    source = models.ForeignKey("sources.DataSource", on_delete=models.CASCADE, related_name="+")
    channel = models.CharField(max_length=32)
    ts = models.CharField(max_length=32)
    answer_record = models.ForeignKey(AnswerRecord, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["source", "channel", "ts"], name="slackanswer_one_per_message"),
        ]

    def __str__(self) -> str:
        return f"{self.channel}:{self.ts}"


class VerifiedAnswer(TenantOwned):
    """An answer checked by someone who knows, shown first to later askers of the same question
    (``search.verified``).

    ``question`` is what the answer answered (the record's standalone question);
    ``question_embedding`` its embedding (the portal's embedder, normalised) for matching; ``text``
    the answer as verified (possibly edited), with ``[n]`` citations of ``cited_sources`` (as
    ``AnswerRecord.cited_sources``); ``shown_document_ids`` every document the answer cited or
    showed (a reader must be able to read them all); ``document_hashes`` maps each cited
    document id (as text) to its ``content_hash`` when asked: a later change or deletion makes
    the answer stale.
    One verified answer per answer record (verifying again replaces it).
    """

    TEXT_CHARS = 8000

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    project = models.ForeignKey("projects.Project", on_delete=models.CASCADE, related_name="+")
    answer_record = models.OneToOneField(
        AnswerRecord, null=True, blank=True, on_delete=models.SET_NULL, related_name="verified"
    )
    question = models.TextField()
    question_embedding = models.JSONField(default=list)
    text = models.TextField()
    cited_sources = models.JSONField(default=list, blank=True)
    cited_document_ids = ArrayField(models.BigIntegerField(), default=list, blank=True)
    shown_document_ids = ArrayField(models.BigIntegerField(), default=list, blank=True)
    document_hashes = models.JSONField(default=dict, blank=True)
    verified_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    verified_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "project"], name="verifiedanswer_project")]

    def __str__(self) -> str:
        return self.question[:80]
