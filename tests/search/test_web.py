"""Web surfaces: allauth login, onboarding, the ask and search pages, the admin."""

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
            "tenant": kb.acme.tenant.pk, "name": "Bad", "slug": "bad", "kind": "docs", "config": '{"folder": "/x"}',
            "include": "[]", "exclude": "[]", "sync_interval_minutes": 60, "generation": 0,
            "projectsource_set-TOTAL_FORMS": 0, "projectsource_set-INITIAL_FORMS": 0,
        },
    )  # fmt: skip
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
