"""Web surfaces: allauth login, onboarding, the ask and search pages, the admin."""

import re

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from projects.selectors import user_tenant_id
from sources.selectors import scope_for_user


@pytest.mark.django_db
def test_login_with_allauth_then_ask_shows_cited_answer(client, kb):
    response = client.post(reverse("account_login"), {"login": "kb-acme-admin", "password": "x" * 12})
    assert response.status_code == 302
    response = client.get(reverse("search:ask"), {"q": "How do I deploy the billing service?"})
    assert response.status_code == 200
    html = response.content.decode()
    assert 'class="cite" href="#source-1"' in html
    assert 'id="source-1"' in html
    assert "Runbook &gt; Deploying the billing service" in html
    assert "https://wiki.acme.example/runbook#deploy" in html
    # The source list is exactly the cited blocks, as the streamed page shows it.
    cited = set(response.context["result"].answer.cited)
    listed = {int(n) for n in re.findall(r'<li id="source-(\d+)"', html)}
    assert listed == cited
    # A decline lists beside it the closest sources its text names, no more.
    response = client.get(reverse("search:ask"), {"q": "What is our parental leave policy?"})
    result, html = response.context["result"], response.content.decode()
    assert not result.answer.cited and "Closest, not answering" in html
    named = [line for line in result.answer.text.splitlines() if line.startswith("- ")]
    listed = [int(n) for n in re.findall(r'<li id="source-(\d+)"', html)]
    assert listed and listed == [ev.n for ev in result.closest] and len(listed) == len(named)


@pytest.mark.django_db
def test_anonymous_user_is_sent_to_login(client):
    response = client.get(reverse("search:ask"), {"q": "anything"})
    assert response.status_code == 302
    assert reverse("account_login") in response["Location"]


@pytest.mark.django_db
def test_another_tenants_project_is_404(client, kb):
    client.force_login(kb.acme.admin)
    response = client.get(reverse("search:ask"), {"q": "deploy", "project": kb.globex.project.slug + "-nope"})
    assert response.status_code == 404
    # Same slug as globex's project ("everything") resolves inside acme only: never globex rows.
    response = client.get(reverse("search:search"), {"q": "zebra protocol", "project": kb.globex.project.slug})
    assert response.status_code == 200
    assert "Globex deploys billing" not in response.content.decode()


@pytest.mark.django_db
def test_search_page_lists_hits_escaped(client, kb):
    client.force_login(kb.acme.admin)
    response = client.get(reverse("search:search"), {"q": "compute_backoff"})
    html = response.content.decode()
    assert "billing/retry.py: compute_backoff" in html
    assert "billing/retry.py:10-24" in html
    assert "<script" not in html.split("</header>")[1]


@pytest.mark.django_db
def test_empty_question_shows_an_error(client, kb):
    client.force_login(kb.acme.admin)
    response = client.get(reverse("search:ask"), {"q": "  "})
    assert "the question is empty" in response.content.decode()


@pytest.mark.django_db
def test_new_user_creates_an_organization_at_onboarding(client):
    user = get_user_model().objects.create_user("newcomer", "new@startup.example", "pw-newcomer-123")
    client.force_login(user)
    response = client.get(reverse("search:ask"))
    assert response.status_code == 302 and response["Location"] == reverse("projects:onboarding")
    response = client.post(reverse("projects:onboarding"), {"name": "Startup Inc"})
    assert response.status_code == 302
    scope = scope_for_user(user)
    assert scope.project_name == "Everything"
    assert user_tenant_id(user) == scope.tenant_id


@pytest.mark.django_db
def test_onboarding_sets_the_default_project(client, kb):
    from projects.services import project_create

    second = project_create(tenant_id=kb.acme.tenant.pk, name="Billing only")
    client.force_login(kb.acme_member)
    response = client.post(reverse("projects:onboarding"), {"project": str(second.public_id), "action": "choose"})
    assert response.status_code == 302
    assert scope_for_user(kb.acme_member).project_slug == "billing-only"
    # A forged project id (another tenant's) is refused and changes nothing.
    client.post(reverse("projects:onboarding"), {"project": str(kb.globex.project.public_id), "action": "choose"})
    assert scope_for_user(kb.acme_member).project_slug == "billing-only"


@pytest.mark.django_db(databases=["default", "owner"])
def test_admin_lists_sources_and_runs_for_staff(client, kb):
    staff = get_user_model().objects.create_superuser("operator", "op@example.com", "pw-operator-123")
    client.force_login(staff)
    response = client.get("/admin/sources/datasource/")
    assert response.status_code == 200
    assert "Acme wiki" in response.content.decode()
    response = client.get("/admin/sources/ingestionrun/")
    assert response.status_code == 200
    assert "succeeded" in response.content.decode().lower()


@pytest.mark.django_db(databases=["default", "owner"])
def test_admin_change_and_add_forms_render(client, kb):
    staff = get_user_model().objects.create_superuser("operator2", "op2@example.com", "pw-operator-123")
    client.force_login(staff)
    for url in [
        "/admin/sources/datasource/add/",
        f"/admin/sources/datasource/{kb.acme_source_id}/change/",
        "/admin/projects/project/add/",
        f"/admin/projects/tenant/{kb.acme.tenant.pk}/change/",
        "/admin/projects/profile/add/",
        "/admin/sources/document/",
    ]:
        assert client.get(url).status_code == 200, url


@pytest.mark.django_db(databases=["default", "owner"])
def test_admin_refuses_an_invalid_source_config_with_the_field_named(client, kb):
    staff = get_user_model().objects.create_superuser("operator3", "op3@example.com", "pw-operator-123")
    client.force_login(staff)
    response = client.post(
        "/admin/sources/datasource/add/",
        {
            "tenant": kb.acme.tenant.pk,
            "name": "Bad",
            "slug": "bad",
            "kind": "docs",
            "config": '{"folder": "/x"}',
            "include": "[]",
            "exclude": "[]",
            "sync_interval_minutes": 60,
            "generation": 0,
            "projectsource_set-TOTAL_FORMS": 0,
            "projectsource_set-INITIAL_FORMS": 0,
        },
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert "invalid config for a &#x27;docs&#x27; data source" in html and "path: Field required" in html


@pytest.mark.django_db
def test_relative_links_open_the_document_page_with_line_numbers(client, kb):
    client.force_login(kb.acme.admin)
    html = client.get(reverse("search:search"), {"q": "compute_backoff"}).content.decode()
    import re

    link = re.search(r'href="(/documents/[0-9a-f-]+/\?id=billing%2Fretry.py%23compute_backoff#L10)"', html)
    assert link, "code hits link to the portal's document page, anchored at the first line"
    page = client.get(link.group(1).split("#")[0])
    assert page.status_code == 200
    body = page.content.decode()
    assert '<span id="L10">' in body and '<span id="L12">' in body
    assert "def compute_backoff(attempt: int) -&gt; float:" in body


@pytest.mark.django_db
def test_document_page_is_404_for_outsiders_and_for_restricted_rows(client, kb):
    from kbportal.tenancy import tenant_context
    from sources.models import DataSource

    with tenant_context(kb.acme.tenant.pk):
        public_id = DataSource.objects.get(pk=kb.acme_source_id).public_id
    url = reverse("search:document", args=[public_id])
    client.force_login(kb.globex.admin)
    assert client.get(url, {"id": "runbook#deploy"}).status_code == 404
    client.force_login(kb.acme_member)
    assert client.get(url, {"id": "runbook#deploy"}).status_code == 200
    assert client.get(url, {"id": "hr#salaries"}).status_code == 404
    client.force_login(kb.acme.admin)
    assert client.get(url, {"id": "hr#salaries"}).status_code == 200


def _sse(response) -> list[tuple[str, dict]]:
    """The (event type, JSON data) pairs of a server-sent-events body."""
    import json

    body = b"".join(response.streaming_content).decode()
    events = []
    for block in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((lines["event"], json.loads(lines["data"])))
    return events


@pytest.mark.django_db
def test_ask_stream_sends_server_sent_events_to_a_member(client, kb):
    client.force_login(kb.acme_member)
    response = client.get(reverse("search:ask_stream"), {"q": "How do I deploy the billing service?"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/event-stream")
    assert response["Cache-Control"] == "no-cache" and response["X-Accel-Buffering"] == "no"
    events = _sse(response)
    types = [t for t, _ in events]
    assert types[:3] == ["plan", "tools", "evidence"] and types[-1] == "done" and "token" in types
    done = events[-1][1]
    assert "".join(d["text"] for t, d in events if t == "token") == done["text"]
    assert done["sources"][0]["title"] == "Runbook > Deploying the billing service"
    assert done["sources"][0]["link"] == "https://wiki.acme.example/runbook#deploy"
    assert done["answer_id"]


@pytest.mark.django_db
def test_ask_stream_refuses_outsiders_anonymous_and_blank_questions(client, kb):
    from projects.services import project_create

    project = project_create(tenant_id=kb.acme.tenant.pk, name="Acme stream only")
    url = reverse("search:ask_stream")
    assert client.get(url, {"q": "deploy"}).status_code == 302  # to the login page
    client.force_login(kb.globex.admin)
    assert client.get(url, {"q": "deploy", "project": project.slug}).status_code == 404
    assert client.get(url, {"q": "deploy", "project": "<script>"}).status_code == 404
    client.force_login(kb.acme_member)
    assert client.get(url, {"q": "deploy", "project": project.slug}).status_code == 200
    assert client.get(url, {"q": "   "}).status_code == 400


def _ask_as(client, user) -> str:
    client.force_login(user)
    events = _sse(client.get(reverse("search:ask_stream"), {"q": "How do I deploy the billing service?"}))
    return events[-1][1]["answer_id"]


@pytest.mark.django_db
def test_feedback_is_stored_for_the_asker_only(client, kb):
    from kbportal.tenancy import tenant_context
    from search.models import AnswerFeedback, AnswerRecord

    answer_id = _ask_as(client, kb.acme_member)
    url = reverse("search:answer_feedback", args=[answer_id])
    assert client.get(url).status_code == 405
    response = client.post(url, {"vote": "up", "comment": "exactly what I needed"})
    assert response.status_code == 302
    response = client.post(url, {"vote": "down"}, HTTP_ACCEPT="application/json")
    assert response.status_code == 200 and response.json()["vote"] == -1
    assert client.post(url, {"vote": "sideways"}).status_code == 400
    with tenant_context(kb.acme.tenant.pk):
        record = AnswerRecord.objects.get(public_id=answer_id)
        feedback = list(AnswerFeedback.objects.filter(answer_record=record))
    assert len(feedback) == 1  # voting again replaces the vote
    assert feedback[0].vote == -1 and feedback[0].user_id == kb.acme_member.pk and feedback[0].comment == ""
    assert feedback[0].question == "How do I deploy the billing service?"
    assert feedback[0].cited_document_ids == record.cited_document_ids and record.cited_document_ids
    assert feedback[0].project_id == kb.acme.project.pk
    # Another user of the same tenant, and another tenant's admin: 404, nothing stored.
    for other in (kb.acme.admin, kb.globex.admin):
        client.force_login(other)
        assert client.post(url, {"vote": "up"}).status_code == 404
        assert client.post(url, {"vote": "up"}, HTTP_ACCEPT="application/json").status_code == 404
    with tenant_context(kb.acme.tenant.pk):
        assert list(AnswerFeedback.objects.values_list("user_id", "vote")) == [(kb.acme_member.pk, -1)]


@pytest.mark.django_db
def test_feedback_needs_the_csrf_token(kb):
    import re

    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    answer_id = _ask_as(client, kb.acme_member)
    url = reverse("search:answer_feedback", args=[answer_id])
    assert client.post(url, {"vote": "up"}).status_code == 403
    page = client.get(reverse("search:ask")).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    assert client.post(url, {"vote": "up", "csrfmiddlewaretoken": token}).status_code == 302


@pytest.mark.django_db
def test_ask_page_renders_the_feedback_form_and_the_stream_hooks(client, kb):
    client.force_login(kb.acme_member)
    html = client.get(reverse("search:ask"), {"q": "How do I deploy the billing service?"}).content.decode()
    assert f'data-stream-url="{reverse("search:ask_stream")}"' in html
    assert 'src="/static/search/ask.js"' in html
    action = re.search(r'<form class="feedback" method="post" action="(/answers/[0-9a-f-]{36}/feedback)"', html)
    assert action, "the server-rendered answer carries its feedback form"


SCRIPT = '<script>alert("kb")</script>'


@pytest.mark.django_db
def test_a_document_with_a_script_tag_stays_text_on_the_ask_and_people_pages(client, make_tenant, settings):
    from sources.services import source_create, source_ingest

    settings.KB_CUSTOM_CONNECTORS = {"test_rows": "tests.search.rows_connector.RowsConnector"}
    t = make_tenant("xss")
    rows = [
        {
            "external_id": "ops#pelican",
            "kind": "thread",
            "title": f"Pelican rollout {SCRIPT}",
            "url": "javascript:alert(1)",
            "content": f"The pelican rollout needs the flamingo flag turned on first. {SCRIPT}",
            "metadata": {"author": f"Mallory {SCRIPT}", "participants": ["Trent"]},
        },
    ]
    source = source_create(
        tenant_id=t.tenant.pk, kind="test_rows", name="Ops", config={"rows": rows}, project_ids=[t.project.pk]
    )
    assert source_ingest(tenant_id=t.tenant.pk, source_id=source.pk).status == "succeeded"
    client.force_login(t.admin)
    for name in ("search:ask", "search:people"):
        html = client.get(reverse(name), {"q": "pelican rollout flamingo flag"}).content.decode()
        body = html.split("</header>")[1]
        assert "Pelican rollout &lt;script&gt;alert(&quot;kb&quot;)&lt;/script&gt;" in body, name
        assert "<script>alert" not in body and 'href="javascript:' not in body, name
    assert "Mallory &lt;script&gt;" in html  # the people page names the author, escaped


def test_a_person_source_lists_the_documents_that_credit_them_each_linked():
    """A who-knows source shows the person's credited documents as links with their role and
    location, in place of the person row's text; a document without a link stays text."""
    from django.template.loader import render_to_string

    from search.pipeline.evidence import Evidence

    person = Evidence(
        n=2,
        document_id=-7,
        kind="person",
        title="Ana Ruiz",
        url="",
        score=1.0,
        tool="who_knows",
        text="Ana Ruiz wrote or took part in 2 of the documents found for this question (credit score 1.00).",
        metadata={
            "documents": [
                {"title": "Fix <retries>", "link": "/documents/x/?id=1", "role": "author", "location": "commit/abc"},
                {"title": "billing.md", "link": "", "role": "file author", "location": "docs/billing.md"},
            ]
        },
    )
    html = render_to_string("search/_source.html", {"ev": person})
    assert '<a href="/documents/x/?id=1" rel="noopener noreferrer">Fix &lt;retries&gt;</a>' in html
    assert "author · commit/abc" in html and "billing.md <span" in html
    assert "credit score" not in html
