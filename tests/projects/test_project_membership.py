"""Project membership: ``Project.visibility`` (tenant | members) and ``ProjectMember`` (viewer | editor).

People (tenant ``pm-a``): the owner (reads everything), ``pm-a-member`` (no project rows),
``pm-a-viewer`` and ``pm-a-editor`` (rows on the restricted project ``Secret``). Tenant ``pm-b`` is
the outsider. Data is committed once per module; each test's own changes roll back.

Sources: ``open`` (in the open project only), ``secret`` (in ``Secret`` only) and ``shared`` (in
both): a source is readable through any project the user may read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from django.test import Client, override_settings

from kbportal.models import AuditEvent
from kbportal.tenancy import tenant_context
from projects.models import Membership, Profile, Project, ProjectMember
from projects.selectors import (
    ScopeNotFound,
    api_token_authenticate,
    api_token_project,
    project_get_for_user,
    project_list_for_user,
    source_ids_readable,
)
from projects.services import (
    ApiTokenError,
    ProjectMemberError,
    ProjectNotFound,
    api_token_create,
    membership_create,
    profile_set_default_project,
    project_create,
    project_member_add,
    project_member_remove,
    project_set_visibility,
)
from search.retrieval import hybrid_search
from sources.models import IngestionRun
from sources.selectors import DocumentNotFound, document_get_for_user, scope_for_token, scope_for_user

CUSTOM = {"test_rows": "tests.search.rows_connector.RowsConnector"}
SECRET_MARKER = "tamarind quarry ledger"
OPEN_MARKER = "juniper harbour roster"
SHARED_MARKER = "cobalt lantern rota"
NO_THROTTLE = {
    "DEFAULT_THROTTLE_RATES": {"ask": "100000/min", "api": "100000/min"},
}


@dataclass
class PM:
    tenant: object
    owner: object
    member: object
    viewer: object
    editor: object
    outsider: object
    open_project: Project
    secret: Project
    open_source: object
    secret_source: object
    shared_source: object


def _row(ext: str, marker: str) -> dict:
    return {
        "external_id": ext,
        "kind": "doc_section",
        "title": f"Plan {ext}",
        "path": f"{ext}.md",
        "content": f"The quarterly staffing plan mentions the {marker} for the platform team.",
    }


@pytest.fixture(scope="module")
def pm(django_db_setup, django_db_blocker) -> PM:
    from projects.services import tenant_onboard
    from sources.services import source_create, source_ingest

    User = get_user_model()
    with django_db_blocker.unblock(), override_settings(KB_CUSTOM_CONNECTORS=CUSTOM):
        a = tenant_onboard(name="PmA", slug="pm-a", admin_username="pm-a-owner", admin_password="p" * 12)
        b = tenant_onboard(name="PmB", slug="pm-b", admin_username="pm-b-owner", admin_password="q" * 12)
        people = {}
        for name in ("member", "viewer", "editor"):
            people[name] = User.objects.create_user(f"pm-a-{name}", f"{name}@pm-a.example", "r" * 12)
            membership_create(tenant_id=a.tenant.pk, user=people[name], role=Membership.Role.MEMBER)
            profile_set_default_project(user=people[name], tenant_id=a.tenant.pk, project_id=a.project.pk)
        secret = project_create(tenant_id=a.tenant.pk, name="Secret", visibility=Project.Visibility.MEMBERS)
        project_member_add(project=secret, user=people["viewer"], role="viewer")
        project_member_add(project=secret, user=people["editor"], role="editor")
        sources = {}
        for key, marker, projects in (
            ("open", OPEN_MARKER, [a.project.pk]),
            ("secret", SECRET_MARKER, [secret.pk]),
            ("shared", SHARED_MARKER, [a.project.pk, secret.pk]),
        ):
            sources[key] = source_create(
                tenant_id=a.tenant.pk,
                kind="test_rows",
                name=f"pm {key}",
                config={"rows": [_row(key, marker)]},
                project_ids=projects,
            )
            assert source_ingest(tenant_id=a.tenant.pk, source_id=sources[key].pk).status == "succeeded"
    return PM(
        tenant=a.tenant,
        owner=a.admin,
        member=people["member"],
        viewer=people["viewer"],
        editor=people["editor"],
        outsider=b.admin,
        open_project=a.project,
        secret=secret,
        open_source=sources["open"],
        secret_source=sources["secret"],
        shared_source=sources["shared"],
    )


def _slugs(user) -> set[str]:
    return {p.slug for p in project_list_for_user(user)}


def test_visibility_decides_who_lists_and_scopes_a_project(pm, db):
    assert _slugs(pm.owner) == {pm.open_project.slug, pm.secret.slug}  # owners see every project
    assert _slugs(pm.viewer) == {pm.open_project.slug, pm.secret.slug}
    assert _slugs(pm.member) == {pm.open_project.slug}
    assert pm.secret.slug not in _slugs(pm.outsider)
    with pytest.raises(ScopeNotFound, match="no project 'secret'"):
        scope_for_user(pm.member, pm.secret.slug)
    scope = scope_for_user(pm.viewer, pm.secret.slug)
    assert set(scope.allowed_source_ids) == {pm.secret_source.pk, pm.shared_source.pk}
    assert set(scope_for_user(pm.member).allowed_source_ids) == {pm.open_source.pk, pm.shared_source.pk}


def test_opening_and_restricting_a_project_changes_access_at_once(pm, db):
    project_set_visibility(project=pm.secret, visibility="tenant")
    assert pm.secret.slug in _slugs(pm.member)
    project_set_visibility(project=pm.secret, visibility="members")
    assert pm.secret.slug not in _slugs(pm.member)
    with pytest.raises(ValueError, match="visibility must be one of tenant, members, got 'hidden'"):
        project_set_visibility(project=pm.secret, visibility="hidden")


def test_an_admin_of_the_tenant_reads_restricted_projects_without_a_member_row(pm, db):
    with tenant_context(pm.tenant.pk):
        Membership.objects.filter(user=pm.member).update(role=Membership.Role.ADMIN)
    assert scope_for_user(pm.member, pm.secret.slug).project_id == pm.secret.pk


def test_retrieval_reads_only_sources_of_readable_projects(pm, db):
    query = "quarterly staffing plan platform team"
    member_hits = hybrid_search(query, scope_for_user(pm.member), limit=10).hits
    assert {h.source_id for h in member_hits} == {pm.open_source.pk, pm.shared_source.pk}
    viewer_hits = hybrid_search(query, scope_for_user(pm.viewer, pm.secret.slug), limit=10).hits
    assert {h.source_id for h in viewer_hits} == {pm.secret_source.pk, pm.shared_source.pk}
    with tenant_context(pm.tenant.pk):
        assert source_ids_readable(user_id=pm.member.pk) == {pm.open_source.pk, pm.shared_source.pk}
        assert source_ids_readable(user_id=pm.viewer.pk) == {
            pm.open_source.pk,
            pm.secret_source.pk,
            pm.shared_source.pk,
        }
        assert source_ids_readable(user_id=pm.outsider.pk) == set()


def test_document_page_reads_a_source_only_through_a_readable_project(pm, db):
    public_id = str(pm.secret_source.public_id)
    with pytest.raises(DocumentNotFound):
        document_get_for_user(pm.member, source_public_id=public_id, external_id="secret")
    document, _ = document_get_for_user(pm.viewer, source_public_id=public_id, external_id="secret")
    assert SECRET_MARKER in document.content
    shared, _ = document_get_for_user(pm.member, source_public_id=str(pm.shared_source.public_id), external_id="shared")
    assert SHARED_MARKER in shared.content  # also in the open project: readable by everyone there
    client = Client()
    client.force_login(pm.member)
    response = client.get(f"/documents/{public_id}/", {"id": "secret"})
    assert response.status_code == 404 and SECRET_MARKER.encode() not in response.content
    client.force_login(pm.viewer)
    response = client.get(f"/documents/{public_id}/", {"id": "secret"})
    assert response.status_code == 200 and SECRET_MARKER.encode() in response.content


def test_an_unreadable_default_project_falls_back_to_a_readable_one(pm, db):
    profile_set_default_project(user=pm.viewer, tenant_id=pm.tenant.pk, project_id=pm.secret.pk)
    assert scope_for_user(pm.viewer).project_slug == pm.secret.slug
    assert project_member_remove(project=pm.secret, user=pm.viewer) is True
    assert Profile.objects.get(user=pm.viewer).default_project_id == pm.secret.pk  # kept, but not used
    assert project_get_for_user(pm.viewer).pk == pm.open_project.pk
    assert scope_for_user(pm.viewer).project_slug == pm.open_project.slug
    with pytest.raises(ProjectNotFound):
        profile_set_default_project(user=pm.member, tenant_id=pm.tenant.pk, project_id=pm.secret.pk)


def test_a_user_without_any_readable_project_has_no_scope(pm, db):
    User = get_user_model()
    lonely = User.objects.create_user("pm-a-lonely", "", "s" * 12)
    membership_create(tenant_id=pm.tenant.pk, user=lonely)
    project_set_visibility(project=pm.open_project, visibility="members")
    assert project_list_for_user(lonely) == []
    with pytest.raises(ScopeNotFound, match="no default project chosen"):
        scope_for_user(lonely)


def test_tokens_follow_the_users_project_membership(pm, db):
    with pytest.raises(ApiTokenError, match="may not read project 'secret'"):
        api_token_create(tenant=pm.tenant, user=pm.member, name="no", project=pm.secret)
    _, pinned = api_token_create(tenant=pm.tenant, user=pm.viewer, name="pinned", project=pm.secret)
    _, roaming = api_token_create(tenant=pm.tenant, user=pm.viewer, name="roaming")
    _, service = api_token_create(tenant=pm.tenant, user=None, name="bot", project=pm.secret)
    profile_set_default_project(user=pm.viewer, tenant_id=pm.tenant.pk, project_id=pm.secret.pk)
    assert scope_for_token(api_token_authenticate(pinned)).project_id == pm.secret.pk
    assert api_token_authenticate(roaming).project_slug == pm.secret.slug

    project_member_remove(project=pm.secret, user=pm.viewer)
    identity = api_token_authenticate(pinned)  # still authenticates, but reaches nothing
    with pytest.raises(ScopeNotFound):
        api_token_project(identity)
    with pytest.raises(ScopeNotFound):
        api_token_project(identity, pm.open_project.slug)  # pinned: no switching either
    roaming_identity = api_token_authenticate(roaming)
    assert roaming_identity.project_slug == pm.open_project.slug  # default fell back
    with pytest.raises(ScopeNotFound):
        scope_for_token(roaming_identity, pm.secret.slug)
    # A service token is the operator's decision for its one project: membership does not apply.
    assert scope_for_token(api_token_authenticate(service)).project_id == pm.secret.pk

    client = Client()
    with override_settings(REST_FRAMEWORK={**_rest_framework(), **NO_THROTTLE}):
        for token in (pinned, roaming):
            headers = {"Authorization": f"Bearer {token}"}
            response = client.get("/api/v1/search", {"q": "staffing plan", "project": pm.secret.slug}, headers=headers)
            assert response.status_code == 404, response.content
            assert SECRET_MARKER.encode() not in response.content
        response = client.get("/api/v1/projects", headers={"Authorization": f"Bearer {pinned}"})
        assert response.status_code == 200 and response.json()["projects"] == []
        response = client.get("/api/v1/projects", headers={"Authorization": f"Bearer {roaming}"})
        assert [(p["slug"], p["is_default"]) for p in response.json()["projects"]] == [(pm.open_project.slug, True)]


def _rest_framework() -> dict:
    from django.conf import settings

    return dict(settings.REST_FRAMEWORK)


def test_api_lists_sources_and_runs_of_readable_projects_only(pm, db):
    client = Client()
    client.force_login(pm.member)
    with override_settings(REST_FRAMEWORK={**_rest_framework(), **NO_THROTTLE}):
        listed = {s["slug"] for s in client.get("/api/v1/sources").json()["sources"]}
        assert listed == {pm.open_source.slug, pm.shared_source.slug}
        assert client.get("/api/v1/sources", {"project": pm.secret.slug}).status_code == 404
        runs = {r["source"] for r in client.get("/api/v1/runs").json()["runs"]}
        assert pm.secret_source.slug not in runs and pm.open_source.slug in runs
        assert client.get("/api/v1/runs", {"source": pm.secret_source.slug}).status_code == 404
        client.force_login(pm.viewer)
        listed = {s["slug"] for s in client.get("/api/v1/sources").json()["sources"]}
        assert listed == {pm.open_source.slug, pm.shared_source.slug, pm.secret_source.slug}


def test_web_pages_404_a_restricted_project_for_a_non_member(pm, db):
    client = Client()
    client.force_login(pm.member)
    for path in ("/", "/search/", "/people/", "/ask/stream"):
        response = client.get(path, {"q": "staffing plan", "project": pm.secret.slug})
        body = b"".join(response.streaming_content) if response.streaming else response.content
        assert response.status_code == 404, (path, response.status_code)
        assert SECRET_MARKER.encode() not in body
    response = client.get("/search/", {"q": "staffing plan"})
    assert response.status_code == 200
    assert OPEN_MARKER.encode() in response.content and SECRET_MARKER.encode() not in response.content
    assert pm.secret.name.encode() not in client.get("/onboarding/").content
    client.force_login(pm.viewer)
    response = client.get("/search/", {"q": "staffing plan", "project": pm.secret.slug})
    assert response.status_code == 200 and SECRET_MARKER.encode() in response.content


def test_only_editors_and_admins_may_sync_a_restricted_projects_source(pm, db, django_capture_on_commit_callbacks):
    client = Client()
    with override_settings(REST_FRAMEWORK={**_rest_framework(), **NO_THROTTLE}):
        client.force_login(pm.viewer)
        response = client.post(f"/api/v1/sources/{pm.secret_source.slug}/sync")
        assert response.status_code == 403, response.content
        client.force_login(pm.member)
        assert client.post(f"/api/v1/sources/{pm.secret_source.slug}/sync").status_code == 404
        client.force_login(pm.editor)
        with django_capture_on_commit_callbacks(execute=False):
            response = client.post(f"/api/v1/sources/{pm.secret_source.slug}/sync")
        assert response.status_code == 202, response.content
        assert response.json()["run_id"]


def test_web_sync_now_answers_as_the_api_for_viewers_members_and_editors(pm, db, django_capture_on_commit_callbacks):
    """One decision (``source_sync_allowed``) on both surfaces: the API's 403/404 is the web's
    404 (a page never tells a source exists), and an editor of the source's project, who may
    sync through the API, may through the web page too."""
    client = Client()
    with tenant_context(pm.tenant.pk):
        before = set(IngestionRun.objects.filter(source=pm.secret_source).values_list("pk", flat=True))
    for user in (pm.viewer, pm.member):
        client.force_login(user)
        assert client.post(f"/sources/{pm.secret_source.slug}/sync").status_code == 404
    with tenant_context(pm.tenant.pk):
        assert set(IngestionRun.objects.filter(source=pm.secret_source).values_list("pk", flat=True)) == before
    client.force_login(pm.editor)
    with django_capture_on_commit_callbacks(execute=False):
        response = client.post(f"/sources/{pm.secret_source.slug}/sync")
    assert response.status_code == 302, response.content
    with tenant_context(pm.tenant.pk):
        run = IngestionRun.objects.filter(source=pm.secret_source).exclude(pk__in=before).get()
        event = AuditEvent.objects.get(action="source.sync", data__run_id=run.pk)
    assert run.status == "queued" and event.actor_id == pm.editor.pk and event.data["via"] == "web"


def test_project_member_rows_are_tenant_owned_under_row_level_security(pm, db):
    with pytest.raises(ProjectMemberError, match="is not a member of the project's organization"):
        project_member_add(project=pm.secret, user=pm.outsider)
    with pytest.raises(ProjectMemberError, match="role must be one of viewer, editor"):
        project_member_add(project=pm.secret, user=pm.member, role="owner")
    member = project_member_add(project=pm.secret, user=pm.member, role="viewer")
    assert project_member_add(project=pm.secret, user=pm.member, role="editor").pk == member.pk
    with connection.cursor() as cursor:  # no tenant set: the app role sees no row at all
        cursor.execute("SELECT count(*) FROM projects_projectmember")
        assert cursor.fetchone()[0] == 0
    other_tenant = get_user_model().objects.get(username="pm-b-owner")
    with tenant_context(pm.tenant.pk):
        assert ProjectMember.objects.filter(project=pm.secret).count() == 3
    b_tenant_id = Profile.objects.get(user=other_tenant).tenant_id
    with tenant_context(b_tenant_id):
        assert ProjectMember.objects.count() == 0
        assert not ProjectMember.all_tenants.filter(project=pm.secret).exists()
        with pytest.raises(Exception, match="row-level security"), transaction.atomic():
            ProjectMember.all_tenants.create(tenant_id=pm.tenant.pk, project=pm.secret, user=pm.owner)
    with tenant_context(pm.tenant.pk), pytest.raises(IntegrityError), transaction.atomic():
        ProjectMember.objects.create(tenant_id=pm.tenant.pk, project=pm.secret, user=pm.member)


@pytest.mark.django_db(databases=["default", "owner"])
def test_admin_edits_project_members_inline(pm):
    User = get_user_model()
    operator = User.objects.create_superuser("pm-operator", "op@example.com", "t" * 12)
    client = Client()
    client.force_login(operator)
    url = f"/admin/projects/project/{pm.secret.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200 and b"members-TOTAL_FORMS" in page.content
    data = {
        "tenant": pm.tenant.pk,
        "name": pm.secret.name,
        "slug": pm.secret.slug,
        "description": "",
        "visibility": "members",
        "members-TOTAL_FORMS": "1",
        "members-INITIAL_FORMS": "0",
        "members-MIN_NUM_FORMS": "0",
        "members-MAX_NUM_FORMS": "1000",
        "members-0-user": pm.outsider.pk,
        "members-0-role": "viewer",
    }
    response = client.post(url, data)
    assert response.status_code == 200 and b"is not a member of this project&#x27;s organization" in response.content
    data["members-0-user"] = pm.member.pk
    response = client.post(url, data)
    assert response.status_code == 302, response.content[:2000]
    # The admin writes through the owner's connection (its own, uncommitted test transaction).
    row = ProjectMember.all_tenants.using("owner").get(project=pm.secret, user=pm.member)
    assert (row.tenant_id, row.role) == (pm.tenant.pk, "viewer")


def test_api_projects_json_names_only_readable_projects_for_a_session(pm, db):
    client = Client()
    client.force_login(pm.member)
    with override_settings(REST_FRAMEWORK={**_rest_framework(), **NO_THROTTLE}):
        body = json.loads(client.get("/api/v1/projects").content)
    assert [p["slug"] for p in body["projects"]] == [pm.open_project.slug]
