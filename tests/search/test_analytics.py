"""Analytics: figures computed from known answer records and feedback, the dashboard page and
``GET /api/v1/analytics`` showing the same numbers, and who may see them.

The rows are written directly (a question asked N days ago cannot be asked through the pipeline),
in two tenants: Acme's main project (5 questions in the last 30 days, one older), Acme's second
project (1 question) and Globex (3 questions that must never be counted for Acme).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from kbportal.tenancy import tenant_context
from projects.models import Membership
from projects.services import api_token_create, membership_create, profile_set_default_project, project_create
from search.analytics import analytics_get, normalise_question
from search.models import AnswerFeedback, AnswerRecord
from sources.models import DataSource, Document

SCRIPT_Q = "Where is the <script>alert(1)</script> runbook?"


@dataclass
class Data:
    acme: object  # OnboardedTenant
    globex: object
    member: object
    second: object  # Acme's second project
    docs: list[Document]  # d1, d2 in source "wiki"; d3 (restricted to someone else) in "vault"
    today: date


# A who-knows person block's stand-in id (search.tools.people.person_id): cited, but no document.
PERSON_BLOCK_ID = -104850611772860


def _doc(tenant_id: int, source: DataSource, external_id: str, title: str, principals=()) -> Document:
    return Document.objects.create(
        tenant_id=tenant_id,
        source=source,
        kind="doc_section",
        external_id=external_id,
        title=title,
        url=f"https://wiki.example/{external_id}",
        content=title,
        text=title,
        content_hash=external_id,
        principals=list(principals),
    )


def _record(
    tenant_id,
    project_id,
    user,
    question,
    *,
    latency,
    first_token=None,
    answered=True,
    evidence=(),
    cited=(),
    days_ago=0,
    today: date,
) -> AnswerRecord:
    with tenant_context(tenant_id):
        record = AnswerRecord.objects.create(
            tenant_id=tenant_id,
            user=user,
            project_id=project_id,
            question=question,
            answered=answered,
            latency_ms=latency,
            first_token_ms=first_token,
            evidence_document_ids=list(evidence),
            cited_document_ids=list(cited),
        )
        asked = datetime.combine(today - timedelta(days=days_ago), time(1), tzinfo=UTC)
        AnswerRecord.objects.filter(pk=record.pk).update(created_at=asked)
    return record


def _vote(record: AnswerRecord, user, vote: int) -> None:
    with tenant_context(record.tenant_id):
        AnswerFeedback.objects.create(
            tenant_id=record.tenant_id,
            answer_record=record,
            user=user,
            project_id=record.project_id,
            question=record.question,
            vote=vote,
        )


@pytest.fixture
def data(make_tenant) -> Data:
    today = timezone.now().astimezone(UTC).date()
    acme, globex = make_tenant("ana-acme"), make_tenant("ana-globex")
    member = get_user_model().objects.create_user("ana-member", "m@ana.example", "pw-member-1234")
    membership_create(tenant_id=acme.tenant.pk, user=member, role=Membership.Role.MEMBER)
    profile_set_default_project(user=member, tenant_id=acme.tenant.pk, project_id=acme.project.pk)
    second = project_create(tenant_id=acme.tenant.pk, name="Second only")
    t = acme.tenant.pk
    with tenant_context(t):
        wiki = DataSource.objects.create(tenant_id=t, name="Wiki", slug="wiki", kind="docs")
        vault = DataSource.objects.create(tenant_id=t, name="Vault", slug="vault", kind="docs")
        d1 = _doc(t, wiki, "deploy", "Runbook > Deploy")
        d2 = _doc(t, wiki, "x", "Glossary > X")
        d3 = _doc(t, vault, "salaries", "Salary bands", principals=["user:999999"])
    p, admin = acme.project.pk, acme.admin
    r1 = _record(
        t,
        p,
        admin,
        "How do I deploy?",
        latency=100,
        first_token=50,
        evidence=[d1.pk, d2.pk],
        cited=[d1.pk, PERSON_BLOCK_ID],
        today=today,
    )
    r2 = _record(
        t,
        p,
        member,
        "how do I   DEPLOY",
        latency=200,
        first_token=150,
        evidence=[d1.pk, d3.pk],
        cited=[d1.pk, d3.pk],
        today=today,
    )
    r3 = _record(t, p, member, SCRIPT_Q, latency=300, answered=False, days_ago=1, today=today)
    _record(
        t, p, admin, SCRIPT_Q.lower().rstrip("?"), latency=400, first_token=250, answered=False, days_ago=2, today=today
    )
    _record(
        t,
        p,
        admin,
        "What is X.",
        latency=1000,
        first_token=350,
        evidence=[d2.pk],
        cited=[d2.pk],
        days_ago=8,
        today=today,
    )
    _record(t, p, admin, "ancient question", latency=99999, evidence=[d1.pk], days_ago=40, today=today)
    other = _record(
        t,
        second.pk,
        admin,
        "second project question",
        latency=5000,
        first_token=10,
        evidence=[d1.pk],
        cited=[d1.pk],
        today=today,
    )
    _vote(r1, admin, 1)
    _vote(r2, member, 1)
    _vote(r3, member, -1)
    _vote(other, admin, -1)
    g = globex.tenant.pk
    for _ in range(3):
        _vote(_record(g, globex.project.pk, globex.admin, "How do I deploy?", latency=7, today=today), globex.admin, 1)
    return Data(acme=acme, globex=globex, member=member, second=second, docs=[d1, d2, d3], today=today)


@pytest.fixture(autouse=True)
def fresh_throttles():
    cache.clear()
    yield
    cache.clear()


def test_normalised_questions_collapse_case_space_and_end_punctuation():
    assert normalise_question("  How do I   DEPLOY?! ") == "how do i deploy"
    assert normalise_question("What is X.") == "what is x"


@pytest.mark.django_db
def test_figures_for_one_project_are_exact(data):
    a = analytics_get(
        tenant_id=data.acme.tenant.pk,
        project_id=data.acme.project.pk,
        project_slug=data.acme.project.slug,
        days=30,
        today=data.today,
    )
    assert (a.questions, a.unanswered, a.unanswered_rate) == (5, 2, 0.4)
    # percentile_cont: p50 of 100,200,300,400,1000 is 300; p95 is 400 + 0.8 * (1000 - 400).
    assert (a.latency_p50_ms, a.latency_p95_ms) == (300.0, 880.0)
    # first token 50,150,250,350 (one question never got a first token): 200 and 250 + 0.85 * 100.
    assert (a.first_token_p50_ms, a.first_token_p95_ms) == (200.0, 335.0)
    assert [(q.query, q.count) for q in a.top_queries] == [
        ("how do i deploy", 2),
        ("where is the <script>alert(1)</script> runbook", 2),
        ("what is x", 1),
    ]
    assert [(q.query, q.count) for q in a.zero_result_queries] == [
        ("where is the <script>alert(1)</script> runbook", 2)
    ]
    assert (a.feedback_up, a.feedback_down, a.feedback_total) == (2, 1, 3)
    assert a.feedback_up_share == pytest.approx(2 / 3)
    d1, d2, d3 = data.docs
    assert [(c.document_id, c.answers, c.title, c.source, c.readable) for c in a.cited_documents] == [
        (d1.pk, 2, "Runbook > Deploy", "wiki", True),
        (d2.pk, 1, "Glossary > X", "wiki", True),
        (d3.pk, 1, "", "vault", False),  # restricted to someone else: counted, title withheld
    ]
    assert [(s.slug, s.citations, s.answers) for s in a.cited_sources] == [("wiki", 3, 3), ("vault", 1, 1)]
    assert len(a.per_day) == 30 and a.per_day[-1].day == data.today and a.since == data.today - timedelta(days=29)
    today, yesterday, two_ago = a.per_day[-1], a.per_day[-2], a.per_day[-3]
    assert (today.questions, today.unanswered, today.users) == (2, 0, 2)
    assert (today.latency_p50_ms, today.latency_p95_ms) == (150.0, 195.0)
    assert (yesterday.questions, yesterday.unanswered, yesterday.users) == (1, 1, 1)
    assert (two_ago.questions, a.per_day[-9].questions, a.per_day[-4].latency_p50_ms) == (1, 1, None)
    assert sum(d.questions for d in a.per_day) == 5
    assert (a.active_users_7_days, a.active_users_window) == (2, 2)
    weeks: dict[date, set[int]] = {}
    for days_ago, user in [(0, "admin"), (0, "member"), (1, "member"), (2, "admin"), (8, "admin")]:
        day = data.today - timedelta(days=days_ago)
        weeks.setdefault(day - timedelta(days=day.weekday()), set()).add(user)
    assert [(w.week, w.users) for w in a.per_week] == sorted((w, len(u)) for w, u in weeks.items())


@pytest.mark.django_db
def test_every_project_window_and_tenant_boundaries(data):
    t = data.acme.tenant.pk
    every = analytics_get(tenant_id=t, days=30, today=data.today)
    assert every.project is None and every.questions == 6
    # 100, 200, 300, 400, 1000, 5000: p50 halfway between 300 and 400; p95 1000 + 0.75 * 4000.
    assert (every.latency_p50_ms, every.latency_p95_ms) == (350.0, 4000.0)
    assert (every.feedback_up, every.feedback_down) == (2, 2)
    assert every.top_queries[0].query == "how do i deploy" and every.top_queries[0].count == 2  # not Globex's 3
    second = analytics_get(tenant_id=t, project_id=data.second.pk, days=30, today=data.today)
    assert (second.questions, second.latency_p50_ms, second.feedback_down) == (1, 5000.0, 1)
    week = analytics_get(tenant_id=t, project_id=data.acme.project.pk, days=7, today=data.today)
    assert (week.questions, len(week.per_day)) == (4, 7)
    assert analytics_get(tenant_id=t, project_id=data.acme.project.pk, days=60, today=data.today).questions == 6
    globex = analytics_get(tenant_id=data.globex.tenant.pk, days=30, today=data.today)
    assert (globex.questions, globex.latency_p50_ms, globex.feedback_up, globex.cited_documents) == (3, 7.0, 3, [])
    # Acme's project id asked for in Globex's tenant: row-level security and the tenant filter find nothing.
    assert analytics_get(tenant_id=data.globex.tenant.pk, project_id=data.acme.project.pk, days=30).questions == 0
    empty = analytics_get(tenant_id=t, project_id=data.second.pk, days=1, today=data.today - timedelta(days=100))
    assert (empty.questions, empty.unanswered_rate, empty.latency_p50_ms, empty.feedback_up_share) == (
        0,
        None,
        None,
        None,
    )
    with pytest.raises(ValueError):
        analytics_get(tenant_id=t, days=0)


@pytest.mark.django_db
def test_the_dashboard_renders_for_an_admin_with_charts_and_escaped_labels(client, data):
    client.force_login(data.acme.admin)
    response = client.get(reverse("search:analytics"), {"project": data.acme.project.slug})
    assert response.status_code == 200
    shown = response.context["analytics"]
    assert (shown.questions, shown.unanswered_rate, shown.latency_p95_ms) == (5, 0.4, 880.0)
    html = response.content.decode()
    assert html.count("<svg") == 3 and "cdn" not in html.lower()
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert '<strong id="unanswered-rate">40.0%</strong>' in html
    assert "Runbook &gt; Deploy" in html and "Salary bands" not in html
    assert 'href="/analytics/"' in html and 'href="/audit/"' in html  # the admin's nav links
    every = client.get(reverse("search:analytics"), {"days": "7"})
    assert every.context["analytics"].questions == 5 and every.context["days"] == 7  # 4 + the second project's
    assert client.get(reverse("search:analytics"), {"project": "no-such-project"}).status_code == 404


@pytest.mark.django_db
def test_members_outsiders_and_people_without_an_organization_get_404(client, data):
    loner = get_user_model().objects.create_user("ana-loner", "l@ana.example", "pw-loner-12345")
    for user in (data.member, loner):
        client.force_login(user)
        response = client.get(reverse("search:analytics"))
        assert response.status_code == 404
    assert 'href="/analytics/"' not in client.get(reverse("projects:onboarding")).content.decode()
    client.force_login(data.globex.admin)
    assert client.get(reverse("search:analytics"), {"project": data.second.slug}).status_code == 404
    own = client.get(reverse("search:analytics"))
    assert own.status_code == 200 and own.context["analytics"].questions == 3  # Globex's own, never Acme's


def _get(token: str, **params):
    return Client().get("/api/v1/analytics", params, headers={"Authorization": f"Bearer {token}"})


@pytest.mark.django_db
def test_the_api_returns_the_pages_numbers_to_admins_only(client, data):
    acme = data.acme
    admin_token = api_token_create(tenant=acme.tenant, user=acme.admin, name="ana-admin")[1]
    client.force_login(acme.admin)
    for params in ({"project": acme.project.slug, "days": 30}, {"days": 7}, {}):
        page = client.get(reverse("search:analytics"), params).context["analytics"].as_dict()
        response = _get(admin_token, **params)
        assert response.status_code == 200, response.content
        assert response.json() == json.loads(json.dumps(page))
    body = _get(admin_token, project=acme.project.slug).json()
    assert (body["questions"], body["unanswered_rate"], body["latency_p50_ms"], body["latency_p95_ms"]) == (
        5,
        0.4,
        300.0,
        880.0,
    )
    assert body["project"] == acme.project.slug and len(body["per_day"]) == 30

    member_token = api_token_create(tenant=acme.tenant, user=data.member, name="ana-member")[1]
    service_token = api_token_create(tenant=acme.tenant, user=None, name="ana-bot", project=acme.project)[1]
    outsider_token = api_token_create(tenant=data.globex.tenant, user=data.globex.admin, name="ana-out")[1]
    assert _get(member_token).status_code == 403
    assert _get(service_token).status_code == 403
    response = _get(outsider_token, project=data.second.slug)
    assert response.status_code == 404 and response.json()["field"] == "project"
    assert _get(outsider_token).json()["questions"] == 3
    assert _get(admin_token, days=0).status_code == 400
    assert _get(admin_token, days=366).json()["field"] == "days"
