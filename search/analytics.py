"""Usage analytics of a tenant (optionally one project): what people ask and how well it goes.

One selector, :func:`analytics_get`, computes every figure in SQL over ``AnswerRecord`` (one row
per question, any surface) and ``AnswerFeedback`` inside the tenant's context, so row-level
security applies on top of the explicit ``tenant_id`` filter. The dashboard page and
``GET /api/v1/analytics`` both render its :meth:`Analytics.as_dict`, so they show the same
numbers.

Definitions (window: the last ``days`` UTC calendar days, today included):

- latency percentiles: ``percentile_cont`` (linear interpolation between the closest ranks, as
  PostgreSQL defines it) of ``latency_ms`` and of ``first_token_ms`` (questions without a first
  token, e.g. declined ones, are left out of the latter), in milliseconds;
- unanswered rate: questions with ``answered`` false / all questions (0..1, ``None`` for none);
- normalised question: lower case, runs of white space as one space, leading and trailing
  spaces and ``?!.`` removed (:func:`normalise_question`, the same as ``NORMALISED_SQL``);
- zero-result question: one that found no evidence at all (``evidence_document_ids`` empty);
- most-cited documents and data sources: answers citing them (an answer counts once per
  document, and once per source for each of its documents cited); a document the viewer may not
  read (restricted to other principals) is counted but its title and link are withheld;
- active users: distinct people who asked, per day, per ISO week (Monday), and over the last 7
  days; feedback: up and down votes given in the window and the share of up votes.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from kbportal.tenancy import tenant_context

ANALYTICS_DAYS_MAX = 365
TOP_LIMIT = 10
# The SQL twin of normalise_question (POSIX classes: no backslashes to escape on either side).
NORMALISED_SQL = "lower(btrim(regexp_replace(r.question, '[[:space:]]+', ' ', 'g'), ' ?!.'))"


def normalise_question(text: str) -> str:
    """A question as the analytics group it: lower case, white space collapsed, ``?!.`` trimmed."""
    return re.sub(r"\s+", " ", text).strip(" ?!.").lower()


@dataclass(frozen=True)
class DayFigures:
    """One UTC day: ``questions``, ``unanswered``, distinct askers (``users``), latency p50/p95 (ms,
    ``None`` on a day without questions)."""

    day: date
    questions: int
    unanswered: int
    users: int
    latency_p50_ms: float | None
    latency_p95_ms: float | None


@dataclass(frozen=True)
class QueryCount:
    query: str
    count: int


@dataclass(frozen=True)
class CitedDocument:
    """A document cited by ``answers`` answers; ``title``/``url``/``source`` are empty when the
    document is gone (re-ingested away) or restricted to principals the viewer is not."""

    document_id: int
    answers: int
    title: str
    url: str
    kind: str
    source: str
    readable: bool


@dataclass(frozen=True)
class CitedSource:
    """A data source whose documents were cited: ``citations`` (answer x document pairs) and
    ``answers`` (distinct answers citing any of its documents)."""

    slug: str
    name: str
    kind: str
    citations: int
    answers: int


@dataclass(frozen=True)
class WeekUsers:
    week: date  # the Monday
    users: int


@dataclass
class Analytics:
    """Every figure of the dashboard for one tenant (and project), over ``days`` days ending ``until``."""

    project: str | None
    days: int
    since: date
    until: date
    questions: int
    unanswered: int
    unanswered_rate: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    first_token_p50_ms: float | None
    first_token_p95_ms: float | None
    per_day: list[DayFigures]
    active_users_7_days: int
    active_users_window: int
    per_week: list[WeekUsers]
    top_queries: list[QueryCount]
    zero_result_queries: list[QueryCount]
    feedback_up: int
    feedback_down: int
    cited_documents: list[CitedDocument] = field(default_factory=list)
    cited_sources: list[CitedSource] = field(default_factory=list)

    @property
    def feedback_total(self) -> int:
        return self.feedback_up + self.feedback_down

    @property
    def feedback_up_share(self) -> float | None:
        """Share of up votes among all votes (0..1), ``None`` without votes."""
        return self.feedback_up / self.feedback_total if self.feedback_total else None

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe (dates as ISO strings); the API's response body."""
        data = asdict(self)
        data["feedback_total"] = self.feedback_total
        data["feedback_up_share"] = self.feedback_up_share
        for key in ("since", "until"):
            data[key] = data[key].isoformat()
        for row in data["per_day"]:
            row["day"] = row["day"].isoformat()
        for row in data["per_week"]:
            row["week"] = row["week"].isoformat()
        return data


def _window_sql(alias: str, project_id: int | None) -> str:
    """The tenant, window (and project) condition on table alias ``alias`` (named parameters)."""
    sql = f"{alias}.tenant_id = %(tenant)s AND {alias}.created_at >= %(start)s AND {alias}.created_at < %(end)s"
    return sql + (f" AND {alias}.project_id = %(project)s" if project_id is not None else "")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 1)


def analytics_get(
    *,
    tenant_id: int,
    project_id: int | None = None,
    project_slug: str | None = None,
    days: int = 30,
    viewer_principals: tuple[str, ...] = (),
    today: date | None = None,
) -> Analytics:
    """The tenant's usage figures (module docstring) over the last ``days`` (1..365) UTC days
    ending ``today`` (default: the current UTC date), for ``project_id`` or every project.

    ``viewer_principals`` (``sources.selectors.user_principals``) decide which cited documents'
    titles the viewer may see. Runs inside ``tenant_context(tenant_id)``; the caller checks that
    the viewer is one of the tenant's admins. Raises ``ValueError`` for ``days`` out of range.
    """
    if not 1 <= days <= ANALYTICS_DAYS_MAX:
        raise ValueError(f"days must be 1..{ANALYTICS_DAYS_MAX}")
    until = today or timezone.now().astimezone(UTC).date()
    since = until - timedelta(days=days - 1)
    start = datetime.combine(since, time.min, tzinfo=UTC)
    end = datetime.combine(until + timedelta(days=1), time.min, tzinfo=UTC)
    where, feedback_where = _window_sql("r", project_id), _window_sql("f", project_id)
    params: dict[str, Any] = {
        "tenant": tenant_id,
        "project": project_id,
        "start": start,
        "end": end,
        "since": since,
        "until": until,
        "week_start": end - timedelta(days=7),
        "limit": TOP_LIMIT,
        "principals": [p for p in viewer_principals if p],
    }
    with tenant_context(tenant_id), connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT count(*), count(*) FILTER (WHERE NOT r.answered),
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY r.latency_ms),
                   percentile_cont(0.95) WITHIN GROUP (ORDER BY r.latency_ms),
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY r.first_token_ms),
                   percentile_cont(0.95) WITHIN GROUP (ORDER BY r.first_token_ms),
                   count(DISTINCT r.user_id),
                   count(DISTINCT r.user_id) FILTER (WHERE r.created_at >= %(week_start)s)
            FROM search_answerrecord r WHERE {where}
            """,
            params,
        )
        questions, unanswered, p50, p95, ft50, ft95, users_window, users_7 = cursor.fetchone()

        cursor.execute(
            f"""
            SELECT d::date, count(r.id), count(r.id) FILTER (WHERE NOT r.answered), count(DISTINCT r.user_id),
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY r.latency_ms),
                   percentile_cont(0.95) WITHIN GROUP (ORDER BY r.latency_ms)
            FROM generate_series(%(since)s::timestamp, %(until)s::timestamp, interval '1 day') AS d
            LEFT JOIN search_answerrecord r
                   ON r.created_at >= d AT TIME ZONE 'UTC' AND r.created_at < (d + interval '1 day') AT TIME ZONE 'UTC'
                  AND {where}
            GROUP BY d ORDER BY d
            """,
            params,
        )
        per_day = [DayFigures(row[0], row[1], row[2], row[3], _rounded(row[4]), _rounded(row[5])) for row in cursor]

        cursor.execute(
            f"""
            SELECT date_trunc('week', r.created_at AT TIME ZONE 'UTC')::date AS week, count(DISTINCT r.user_id)
            FROM search_answerrecord r WHERE {where} AND r.user_id IS NOT NULL
            GROUP BY week ORDER BY week
            """,
            params,
        )
        per_week = [WeekUsers(week, users) for week, users in cursor]

        top: dict[str, list[QueryCount]] = {}
        for key, extra in (("top", ""), ("zero", " AND cardinality(r.evidence_document_ids) = 0")):
            cursor.execute(
                f"""
                SELECT {NORMALISED_SQL} AS q, count(*) AS n FROM search_answerrecord r
                WHERE {where}{extra} AND {NORMALISED_SQL} <> ''
                GROUP BY q ORDER BY n DESC, q LIMIT %(limit)s
                """,
                params,
            )
            top[key] = [QueryCount(q, n) for q, n in cursor]

        cursor.execute(
            f"""
            SELECT count(*) FILTER (WHERE f.vote = 1), count(*) FILTER (WHERE f.vote = -1)
            FROM search_answerfeedback f WHERE {feedback_where}
            """,
            params,
        )
        up, down = cursor.fetchone()

        cursor.execute(
            f"""
            SELECT c.doc_id, count(DISTINCT r.id) AS n, d.title, d.url, d.kind, s.slug,
                   d.id IS NOT NULL
                   AND (d.principals = '[]'::jsonb OR d.principals ?| %(principals)s::text[]) AS readable
            FROM search_answerrecord r
            CROSS JOIN LATERAL unnest(r.cited_document_ids) AS c(doc_id)
            LEFT JOIN sources_document d ON d.id = c.doc_id
            LEFT JOIN sources_datasource s ON s.id = d.source_id
            WHERE {where} AND c.doc_id > 0
            GROUP BY c.doc_id, d.id, d.title, d.url, d.kind, s.slug
            ORDER BY n DESC, c.doc_id LIMIT %(limit)s
            """,
            params,
        )
        cited_documents = [
            CitedDocument(
                document_id=doc_id,
                answers=n,
                title=(title or "") if readable else "",
                url=(url or "") if readable else "",
                kind=(kind or "") if readable else "",
                source=slug or "",
                readable=bool(readable),
            )
            for doc_id, n, title, url, kind, slug, readable in cursor
        ]

        cursor.execute(
            f"""
            SELECT s.slug, s.name, s.kind, count(*) AS citations, count(DISTINCT r.id) AS answers
            FROM search_answerrecord r
            CROSS JOIN LATERAL unnest(r.cited_document_ids) AS c(doc_id)
            JOIN sources_document d ON d.id = c.doc_id
            JOIN sources_datasource s ON s.id = d.source_id
            WHERE {where}
            GROUP BY s.id, s.slug, s.name, s.kind
            ORDER BY citations DESC, s.slug LIMIT %(limit)s
            """,
            params,
        )
        cited_sources = [CitedSource(*row) for row in cursor]

    return Analytics(
        project=project_slug,
        days=days,
        since=since,
        until=until,
        questions=questions,
        unanswered=unanswered,
        unanswered_rate=(unanswered / questions) if questions else None,
        latency_p50_ms=_rounded(p50),
        latency_p95_ms=_rounded(p95),
        first_token_p50_ms=_rounded(ft50),
        first_token_p95_ms=_rounded(ft95),
        per_day=per_day,
        active_users_7_days=users_7,
        active_users_window=users_window,
        per_week=per_week,
        top_queries=top["top"],
        zero_result_queries=top["zero"],
        feedback_up=up,
        feedback_down=down,
        cited_documents=cited_documents,
        cited_sources=cited_sources,
    )
