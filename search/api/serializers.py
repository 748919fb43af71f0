"""Request validation and response shapes of the API (declarations only, no logic).

Request serializers validate query parameters and JSON bodies (a bad value is a 400 naming the
field). Response serializers describe what the views return; those over model rows
(runs, sources, projects) also render them, the others document dictionaries that services
already build (``AskResult.as_dict``, ``Evidence.as_dict``, ``Expert.as_dict``).
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import serializers

from search.analytics import ANALYTICS_DAYS_MAX
from search.retrieval import MAX_QUERY_CHARS
from sources.models import Document, IngestionRun
from sources.services.managed import shown_text

SLUG_MAX = 80
SEARCH_LIMIT_MAX = 50
WHO_KNOWS_LIMIT_MAX = 20
RUNS_LIMIT_MAX = 200
FEEDBACK_COMMENT_MAX = 2000  # search.services.FEEDBACK_COMMENT_CHARS


def _project_field(*, body: bool = False) -> serializers.SlugField:
    return serializers.SlugField(
        max_length=SLUG_MAX,
        required=False,
        allow_null=body,  # a JSON body may say "project": null; a query string just leaves it out
        help_text="Project slug (default: the token's project, or the user's default project).",
    )


# ---------- requests -----------------------------------------------------------------------------


class AskRequestSerializer(serializers.Serializer):
    question = serializers.CharField(
        help_text=f"The question, in plain words (at most {MAX_QUERY_CHARS:,} characters)."
    )
    project = _project_field(body=True)
    conversation_id = serializers.UUIDField(
        required=False,
        allow_null=True,
        help_text="Continue this conversation of yours (the `conversation_id` of an earlier answer): the question "
        "is read with its earlier turns in mind. Without it, a personal token's question starts a new one.",
    )


class AskQuerySerializer(serializers.Serializer):
    stream = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Stream server-sent events (plan, tools, evidence, token..., done) instead of one JSON "
        "document; also chosen by `Accept: text/event-stream`.",
    )


class SearchQuerySerializer(serializers.Serializer):
    q = serializers.CharField(help_text=f"Keywords or a question (at most {MAX_QUERY_CHARS:,} characters).")
    project = _project_field()
    limit = serializers.IntegerField(min_value=1, max_value=SEARCH_LIMIT_MAX, default=10, help_text="How many hits.")
    kind = serializers.MultipleChoiceField(
        choices=Document.Kind.choices,
        required=False,
        help_text="Only rows of these kinds (repeat the parameter for several).",
    )


class WhoKnowsQuerySerializer(serializers.Serializer):
    q = serializers.CharField(help_text=f"A topic, system or question (at most {MAX_QUERY_CHARS:,} characters).")
    project = _project_field()
    limit = serializers.IntegerField(
        min_value=1, max_value=WHO_KNOWS_LIMIT_MAX, default=10, help_text="How many people."
    )


class SourcesQuerySerializer(serializers.Serializer):
    project = _project_field()


class RunsQuerySerializer(serializers.Serializer):
    source: Any = serializers.SlugField(
        max_length=SLUG_MAX, required=False, help_text="Only runs of this data source (slug)."
    )
    limit = serializers.IntegerField(min_value=1, max_value=RUNS_LIMIT_MAX, default=50, help_text="How many runs.")


class FeedbackRequestSerializer(serializers.Serializer):
    vote = serializers.ChoiceField(choices=[(1, "helpful"), (-1, "not helpful")], help_text="1 or -1.")
    comment = serializers.CharField(
        max_length=FEEDBACK_COMMENT_MAX, required=False, allow_blank=True, default="", help_text="Optional."
    )


class AnalyticsQuerySerializer(serializers.Serializer):
    project = serializers.SlugField(
        max_length=SLUG_MAX, required=False, help_text="Only this project (slug); default: every project."
    )
    days = serializers.IntegerField(
        min_value=1, max_value=ANALYTICS_DAYS_MAX, default=30, help_text="The last N UTC days, today included."
    )


# ---------- responses ----------------------------------------------------------------------------


class ErrorSerializer(serializers.Serializer):
    error = serializers.CharField(help_text="What went wrong, naming the input at fault.")
    field = serializers.CharField(allow_null=True, help_text="The body field or query parameter at fault, if one.")
    code = serializers.CharField(help_text="invalid, required, not_found, revoked, throttled, server_error, ...")
    request_id = serializers.CharField(help_text="Also the X-Request-ID header; quote it when reporting a 500.")
    errors: Any = serializers.DictField(
        child=serializers.JSONField(), required=False, help_text="400: every field's messages."
    )
    reason = serializers.CharField(
        required=False,
        help_text="401: malformed, unknown, revoked, expired, not_member (the token) or not_authenticated.",
    )
    retry_after = serializers.IntegerField(required=False, allow_null=True, help_text="429: seconds to wait.")


class EvidenceSerializer(serializers.Serializer):
    n = serializers.IntegerField(help_text="1-based rank; what an answer's [n] citations refer to.")
    document_id = serializers.IntegerField()
    kind = serializers.CharField(help_text="code_chunk, doc_section, thread, commit, person, ...")
    title = serializers.CharField(allow_blank=True)
    url = serializers.CharField(allow_blank=True, help_text="The original link as ingested (may be path#Lstart-Lend).")
    link = serializers.CharField(allow_blank=True, help_text="Where to open it: http(s) URL or portal path.")
    location = serializers.CharField(allow_blank=True, help_text="path:start-end for code, else the path or url.")
    path = serializers.CharField(allow_blank=True)
    start_line = serializers.IntegerField(allow_null=True)
    end_line = serializers.IntegerField(allow_null=True)
    text = serializers.CharField(allow_blank=True, help_text="The block's text, at most 1,200 characters.")
    context: Any = serializers.CharField(
        allow_blank=True, help_text="Neighbouring context (sections, signature, thread)."
    )
    score = serializers.FloatField(help_text="Fused retrieval score (unitless, higher is better).")
    tool = serializers.CharField()
    updated_at = serializers.DateTimeField(allow_null=True, help_text="Last activity, ISO 8601.")
    metadata = serializers.DictField(help_text="symbol, language, heading_path, channel, participants, sha, ...")
    source_public_id = serializers.CharField(allow_blank=True)
    external_id = serializers.CharField(allow_blank=True)
    lexical_rank = serializers.IntegerField(allow_null=True)
    similarity = serializers.FloatField(allow_null=True, help_text="Cosine similarity to the query, when dense-ranked.")
    sections = serializers.ListField(
        child=serializers.DictField(),
        help_text="Other sections or chunks of the same file merged into this block (its text follows the block's "
        "own): document_id, title, location, link, start_line, end_line.",
    )


class PlannedCallSerializer(serializers.Serializer):
    tool = serializers.CharField()
    query = serializers.CharField()


class PlanSerializer(serializers.Serializer):
    planner = serializers.CharField(help_text="llm, rules or fallback")
    tools = serializers.ListField(child=serializers.CharField())
    calls = PlannedCallSerializer(many=True)
    errors: Any = serializers.ListField(child=serializers.CharField())


class AskEventSerializer(serializers.Serializer):
    """One server-sent event of a streamed answer (``search.services.AskEvent``)."""

    event = serializers.ChoiceField(
        choices=["plan", "tools", "evidence", "token", "done", "failed"],
        help_text="In order: plan, tools, evidence, token (zero or more), done; failed if the answer broke.",
    )
    data: Any = serializers.CharField(
        help_text="One line of JSON: token {text}; done {answer_id, text, answered, cited, sources, timings_ms, ...}."
    )


class RewriteSerializer(serializers.Serializer):
    method = serializers.ChoiceField(choices=["none", "rules", "llm"], help_text="How the follow-up was read.")
    standalone = serializers.CharField(allow_null=True, help_text="The question answered (null: as asked).")
    carried = serializers.ListField(child=serializers.CharField(), help_text="Earlier words the rule carried forward.")
    error = serializers.CharField(allow_blank=True, help_text="Why the LLM rewrite fell back to the rule.")


class AskResultSerializer(serializers.Serializer):
    answer_id = serializers.UUIDField(help_text="For POST /api/v1/answers/{answer_id}/feedback.")
    conversation_id = serializers.UUIDField(
        allow_null=True, help_text="The conversation this answer is a turn of (null for a service token)."
    )
    question = serializers.CharField()
    standalone_question = serializers.CharField(
        help_text="What was answered: the follow-up's rewrite, or the question."
    )
    rewrite = RewriteSerializer()
    answer = serializers.CharField(allow_blank=True, help_text="The answer text with [n] citations.")
    answered = serializers.BooleanField(help_text="False when the evidence does not answer the question.")
    synthesizer = serializers.CharField(help_text="llm or extractive")
    cited = serializers.ListField(child=serializers.IntegerField(), help_text="The evidence numbers cited.")
    sources = EvidenceSerializer(many=True, help_text="Exactly the cited evidence blocks.")
    evidence = EvidenceSerializer(many=True)
    plan = PlanSerializer()
    tools_run = serializers.ListField(
        child=serializers.DictField(), help_text="[{tool, query, rows, ms}] or [{tool, query, error}]"
    )
    tool_errors = serializers.DictField(child=serializers.CharField())
    timings_ms = serializers.DictField(child=serializers.FloatField(), help_text="plan, tools, synthesize, total (ms)")


class SearchResultSerializer(serializers.Serializer):
    project = serializers.CharField(help_text="The project searched (slug).")
    query = serializers.CharField()
    hits = EvidenceSerializer(many=True)


class ExpertSerializer(serializers.Serializer):
    name = serializers.CharField()
    score = serializers.FloatField(help_text="Sum of credits (unitless, higher is more).")
    aliases = serializers.ListField(child=serializers.CharField(), help_text="Other names and emails merged in.")
    documents = EvidenceSerializer(many=True, help_text="The rows behind the score; metadata has role and credit.")


class WhoKnowsResultSerializer(serializers.Serializer):
    project = serializers.CharField()
    query = serializers.CharField()
    experts = ExpertSerializer(many=True)


class ProjectSerializer(serializers.Serializer):
    slug = serializers.CharField()
    name = serializers.CharField()
    description = serializers.CharField(allow_blank=True)
    is_default = serializers.BooleanField(help_text="Used when a call names no project.")


class ProjectListSerializer(serializers.Serializer):
    projects = ProjectSerializer(many=True)


class ShownTextField(serializers.CharField):
    """An error as an organization sees it: the server's folders left out
    (``sources.services.managed.shown_text``)."""

    def to_representation(self, value):
        return shown_text(super().to_representation(value))


class RunSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    source: Any = serializers.CharField(source="source.slug", help_text="The data source's slug.")
    status = serializers.ChoiceField(choices=IngestionRun.Status.choices)
    seen = serializers.IntegerField(help_text="Rows the connector produced.")
    created = serializers.IntegerField()
    updated = serializers.IntegerField()
    unchanged = serializers.IntegerField()
    deleted = serializers.IntegerField()
    embedded = serializers.IntegerField(help_text="Rows whose embedding was computed.")
    skipped = serializers.IntegerField()
    error = ShownTextField(allow_blank=True)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    duration_seconds = serializers.FloatField(allow_null=True)
    units_done = serializers.IntegerField(help_text="Units (units_label) the connector has finished: progress.")
    units_total = serializers.IntegerField(allow_null=True, help_text="Units expected in all (null: not counted).")
    units_label = serializers.CharField(allow_blank=True, help_text="What a unit is: files, day files, records...")
    eta_seconds = serializers.SerializerMethodField(
        help_text="A running run's estimated seconds left (the rate so far, extrapolated), else null."
    )

    def get_eta_seconds(self, run: IngestionRun) -> float | None:
        eta = run.eta_seconds(timezone.now())
        return None if eta is None else round(eta, 1)


class RunListSerializer(serializers.Serializer):
    runs = RunSerializer(many=True)


class SourceSerializer(serializers.Serializer):
    slug = serializers.CharField(source="source.slug")
    kind = serializers.CharField(source="source.kind", help_text="git, docs, slack_export, jsonl, ...")
    name = serializers.CharField(source="source.name")
    status = serializers.ChoiceField(
        choices=[*IngestionRun.Status.choices, ("never", "Never synced")], help_text="The latest run's status."
    )
    projects = serializers.ListField(child=serializers.CharField(), help_text="Your projects it is part of (slugs).")
    last_synced_at = serializers.DateTimeField(source="source.last_synced_at", allow_null=True)
    indexed_rows = serializers.IntegerField(source="source.indexed_rows")
    sync_interval_minutes = serializers.IntegerField(source="source.sync_interval_minutes")
    enabled = serializers.BooleanField(source="source.enabled", help_text="Scheduled syncs run only when true.")
    last_success_at = serializers.DateTimeField(source="source.last_success_at", allow_null=True)
    consecutive_failures = serializers.IntegerField(
        source="source.consecutive_failures", help_text="Failed runs in a row (0: healthy)."
    )
    backoff_until = serializers.DateTimeField(
        source="source.backoff_until", allow_null=True, help_text="A failing source is not scheduled before this."
    )
    last_error = ShownTextField(source="source.last_error", help_text="The last failed run's error (or empty).")
    next_run_at = serializers.DateTimeField(allow_null=True, help_text="The next scheduled run (null: disabled).")
    last_run = RunSerializer(allow_null=True)


class SourceListSerializer(serializers.Serializer):
    sources = SourceSerializer(many=True)


class SyncQueuedSerializer(serializers.Serializer):
    run_id = serializers.IntegerField(help_text="The queued run; follow it with GET /api/v1/runs?source=...")
    source: Any = serializers.CharField()
    status = serializers.CharField(help_text="queued")


class FeedbackSerializer(serializers.Serializer):
    answer_id = serializers.UUIDField()
    vote = serializers.IntegerField()
    comment = serializers.CharField(allow_blank=True)


class AnalyticsDaySerializer(serializers.Serializer):
    day = serializers.DateField()
    questions = serializers.IntegerField()
    unanswered = serializers.IntegerField()
    users = serializers.IntegerField(help_text="Distinct people who asked that day.")
    latency_p50_ms = serializers.FloatField(allow_null=True)
    latency_p95_ms = serializers.FloatField(allow_null=True)


class AnalyticsWeekSerializer(serializers.Serializer):
    week = serializers.DateField(help_text="The week's Monday.")
    users = serializers.IntegerField(help_text="Distinct people who asked that week (within the window).")


class QueryCountSerializer(serializers.Serializer):
    query = serializers.CharField(help_text="The question, normalised (lower case, spaces collapsed, ?!. trimmed).")
    count = serializers.IntegerField()


class CitedDocumentSerializer(serializers.Serializer):
    document_id = serializers.IntegerField()
    answers = serializers.IntegerField(help_text="Answers citing it.")
    title = serializers.CharField(allow_blank=True, help_text="Empty when removed or restricted from you.")
    url = serializers.CharField(allow_blank=True)
    kind = serializers.CharField(allow_blank=True)
    source: Any = serializers.CharField(allow_blank=True, help_text="Its data source's slug.")
    readable = serializers.BooleanField(help_text="False: removed since, or restricted to other principals.")


class CitedSourceSerializer(serializers.Serializer):
    slug = serializers.CharField()
    name = serializers.CharField()
    kind = serializers.CharField()
    citations = serializers.IntegerField(help_text="Citations of its documents (answer x document).")
    answers = serializers.IntegerField(help_text="Answers citing any of its documents.")


class AnalyticsSerializer(serializers.Serializer):
    """``search.analytics.Analytics.as_dict`` (the dashboard's numbers); times in milliseconds."""

    project = serializers.CharField(allow_null=True, help_text="The project (slug), or null for every project.")
    days = serializers.IntegerField()
    since = serializers.DateField()
    until = serializers.DateField()
    questions = serializers.IntegerField()
    unanswered = serializers.IntegerField()
    unanswered_rate = serializers.FloatField(allow_null=True, help_text="0..1; null without questions.")
    latency_p50_ms = serializers.FloatField(allow_null=True)
    latency_p95_ms = serializers.FloatField(allow_null=True)
    first_token_p50_ms = serializers.FloatField(allow_null=True)
    first_token_p95_ms = serializers.FloatField(allow_null=True)
    per_day = AnalyticsDaySerializer(many=True)
    active_users_7_days = serializers.IntegerField()
    active_users_window = serializers.IntegerField()
    per_week = AnalyticsWeekSerializer(many=True)
    top_queries = QueryCountSerializer(many=True)
    zero_result_queries = QueryCountSerializer(many=True, help_text="Questions that found no evidence.")
    feedback_up = serializers.IntegerField()
    feedback_down = serializers.IntegerField()
    feedback_total = serializers.IntegerField()
    feedback_up_share = serializers.FloatField(allow_null=True, help_text="0..1; null without votes.")
    cited_documents = CitedDocumentSerializer(many=True)
    cited_sources = CitedSourceSerializer(many=True)


class ConversationSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    title = serializers.CharField(help_text="The first question.")
    project = serializers.CharField(allow_blank=True, help_text="Project slug (blank if the project was deleted).")
    turns = serializers.IntegerField()
    updated_at = serializers.DateTimeField()


class ConversationTurnSerializer(serializers.Serializer):
    answer_id = serializers.UUIDField()
    question = serializers.CharField()
    standalone_question = serializers.CharField()
    rewrite_method = serializers.ChoiceField(choices=["none", "rules", "llm"])
    answer = serializers.CharField(allow_blank=True)
    answered = serializers.BooleanField()
    sources = serializers.ListField(child=serializers.DictField(), help_text="The cited sources as shown then.")
    created_at = serializers.DateTimeField()


class ConversationListSerializer(serializers.Serializer):
    conversations = ConversationSerializer(many=True, help_text="Most recently active first (at most 100).")


class ConversationDetailSerializer(serializers.Serializer):
    conversation = ConversationSerializer()
    turns = ConversationTurnSerializer(many=True, help_text="Oldest first.")
