"""/manage/sources/: an organization's admins add and edit data sources through forms generated
from each connector's config model, upload files, test a connection, and never reach outside
their organization (another organization's files, the server's own folders, private networks)."""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from kbportal.models import AuditEvent
from kbportal.secrets import is_encrypted
from kbportal.tenancy import tenant_context
from search.retrieval import hybrid_search
from sources.connectors.registry import get_connector_class
from sources.forms import config_form_class
from sources.models import DataSource, ProjectSource
from sources.selectors import scope_for_user
from sources.services import source_create, source_ingest

pytestmark = pytest.mark.django_db

PAGE = "The quarterly kelp harvest report is filed by the tide operations team every March."


@pytest.fixture(autouse=True)
def _files_root(settings, tmp_path):
    settings.KB_TENANT_FILES_ROOT = tmp_path / "tenant-files"
    settings.KB_UPLOAD_MAX_BYTES = 200_000


@pytest.fixture
def acme(make_tenant):
    return make_tenant("mgacme")


def _admin(tenant) -> Client:
    client = Client()
    client.force_login(tenant.admin)
    return client


def _zip(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return buffer.getvalue()


def _post(client: Client, url: str, data: dict, upload: tuple[str, bytes] | None = None):
    body = dict(data)
    if upload:
        body["upload"] = SimpleUploadedFile(upload[0], upload[1])
    return client.post(url, body)


def _docs_form(tenant, **extra) -> dict:
    return {
        "name": "Handbook",
        "projects": [str(tenant.project.pk)],
        "sync_interval_minutes": 60,
        "enabled": "on",
        "config-glob": "**/*.md",
        "config-max_file_bytes": 2_000_000,
        "config-max_section_chars": 4000,
        "config-min_section_chars": 40,
        "config-text_format": "text",
        "action": "save",
        **extra,
    }


def test_the_form_is_generated_from_the_config_model():
    docs = config_form_class("docs", get_connector_class("docs").config_model)()
    assert list(docs.fields)[0] == "path" and docs.fields["path"].required
    assert [c for c, _ in docs.fields["text_format"].choices] == ["text", "rst", "markdown"]
    assert docs.fields["max_section_chars"].min_value == 200
    assert "**/*.md" in docs.fields["glob"].initial and "One per line" in docs.fields["glob"].help_text
    assert "row paths are relative to it" in docs.fields["path"].help_text  # from the model's docstring
    slack = config_form_class("slack", get_connector_class("slack").config_model)()
    assert slack.fields["token"].widget.input_type == "password" and "allow_private_network" not in slack.fields
    assert not slack.is_bound


def test_an_admin_uploads_a_docs_folder_and_its_pages_are_searchable_after_a_sync(acme, settings):
    admin = _admin(acme)
    archive = _zip({"handbook/kelp.md": f"# Kelp harvest\n\n{PAGE}\n", "handbook/other.md": "# Other\n\nNothing.\n"})
    saved = _post(admin, "/manage/sources/new/docs/", _docs_form(acme), upload=("handbook.zip", archive))
    assert saved.status_code == 302, saved.content.decode()[-3000:]
    with tenant_context(acme.tenant.pk):
        source = DataSource.objects.get(slug="handbook")
        assert list(ProjectSource.objects.filter(source=source).values_list("project_id", flat=True)) == [
            acme.project.pk
        ]
        [created] = AuditEvent.objects.filter(action="source.create")
    root = (Path(settings.KB_TENANT_FILES_ROOT) / acme.tenant.slug).resolve()
    assert Path(source.config["path"]).is_relative_to(root) and (Path(source.config["path"]) / "handbook").is_dir()
    assert created.actor_id == acme.admin.pk
    assert source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk).status == "succeeded"
    hits = hybrid_search("kelp harvest report", scope_for_user(acme.admin), limit=5).hits
    assert any(PAGE in h.content for h in hits)
    # Test connection on the saved source reads without writing.
    tested = admin.post(
        f"/manage/sources/{source.slug}/", {**_docs_form(acme), "action": "test", "config-path": source.config["path"]}
    )
    assert re.search(r"Connected: \d+ rows", tested.content.decode())


@pytest.mark.parametrize("path", ["/etc", "../", "../mgother", "https://example.com/x", "file:///etc"])
def test_a_path_outside_the_organizations_files_is_refused(acme, path):
    answer = _post(_admin(acme), "/manage/sources/new/docs/", _docs_form(acme, **{"config-path": path}))
    assert answer.status_code == 200
    body = answer.content.decode()
    assert "outside your organization" in body or "not a URL" in body
    with tenant_context(acme.tenant.pk):
        assert not DataSource.objects.exists()


def test_a_link_inside_the_organizations_files_cannot_lead_out(acme, settings, tmp_path):
    root = Path(settings.KB_TENANT_FILES_ROOT) / acme.tenant.slug
    root.mkdir(parents=True)
    secret = tmp_path / "server-secrets"
    secret.mkdir()
    (root / "innocent").symlink_to(secret)
    answer = _post(_admin(acme), "/manage/sources/new/docs/", _docs_form(acme, **{"config-path": "innocent"}))
    assert "outside your organization" in answer.content.decode()


@pytest.mark.parametrize(
    "member", ["../escape.md", "/abs.md", "a/../../escape.md"], ids=["dotdot", "absolute", "nested-dotdot"]
)
def test_an_unsafe_zip_is_refused_and_nothing_is_kept(acme, settings, member):
    archive = _zip({"ok.md": "# ok\n", member: "# escaped\n"})
    answer = _post(_admin(acme), "/manage/sources/new/docs/", _docs_form(acme), upload=("bad.zip", archive))
    assert "unsafe path" in answer.content.decode()
    root = Path(settings.KB_TENANT_FILES_ROOT)
    assert not list(root.rglob("*.md")) and not (root.parent / "escape.md").exists()


def test_an_upload_over_the_limit_is_refused(acme, settings):
    answer = _post(_admin(acme), "/manage/sources/new/docs/", _docs_form(acme), upload=("big.md", b"x" * 300_000))
    assert "larger than the limit of 200000 bytes" in answer.content.decode()
    assert not list(Path(settings.KB_TENANT_FILES_ROOT).rglob("big.md"))


def _github_form(tenant, **extra) -> dict:
    return {
        "name": "Issues",
        "projects": [str(tenant.project.pk)],
        "sync_interval_minutes": 60,
        "enabled": "on",
        "config-owner": "acme",
        "config-repo": "app",
        "config-base_url": "http://127.0.0.1:9/api",
        "config-page_size": 100,
        "config-max_rate_limit_wait_seconds": 900,
        "config-rate_limit_retries": 5,
        "config-include_issues": "on",
        "config-include_pull_requests": "on",
        "config-incremental": "on",
        "action": "test",
        **extra,
    }


def test_a_private_address_is_refused_to_an_organization_admin(acme):
    body = _admin(acme).post("/manage/sources/new/github/", _github_form(acme, **{"config-token": "ghp_typed"}))
    text = body.content.decode()
    assert "private" in text and "127.0.0.1" in text and "Connected" not in text
    assert "ghp_typed" not in text  # a typed secret is never echoed back
    # Slack's address is the operator's: its form has no such field.
    slack = _admin(acme).get("/manage/sources/new/slack/").content.decode()
    assert 'name="config-base_url"' not in slack


@pytest.mark.parametrize(
    "path, message",
    [
        ("/srv/repos/app", "names an https:// URL"),
        ("repo-folder", "names an https:// URL"),
        ("https://deploy:ghp_secret@github.com/acme/app.git", "credentials in the URL"),
        ("ssh://git@github.com/acme/app.git", "names an https:// URL"),
    ],
)
def test_a_git_source_added_here_names_a_public_https_url(acme, path, message):
    form = {**_docs_form(acme), "config-path": path, "config-max_commits": 2000, "config-max_file_bytes": 1_000_000}
    body = _admin(acme).post("/manage/sources/new/git/", form).content.decode()
    assert message in body  # (the form shows the person what they typed, as forms do)
    with tenant_context(acme.tenant.pk):
        assert not DataSource.objects.exists()


def test_a_changed_address_loses_the_operators_network_flag_and_the_stored_secret(acme):
    source = source_create(
        tenant_id=acme.tenant.pk,
        kind="github",
        name="Internal GHE",
        project_ids=[acme.project.pk],
        config={
            "owner": "acme",
            "repo": "app",
            "token": "ghp_STORED",
            "base_url": "http://10.1.2.3/api",
            "allow_private_network": True,
        },
    )
    admin = _admin(acme)
    url = f"/manage/sources/{source.slug}/"
    # Pointing it elsewhere with the stored token kept: refused, the token must be typed again.
    moved = admin.post(url, _github_form(acme, **{"config-base_url": "https://attacker.example/api"}))
    assert "enter the secret again" in moved.content.decode()
    # A private address with a new token: the operator's flag no longer covers it.
    private = admin.post(
        url,
        _github_form(
            acme, **{"config-base_url": "http://127.0.0.1:9/api", "config-token": "ghp_new", "action": "save"}
        ),
    )
    assert "private" in private.content.decode()
    with tenant_context(acme.tenant.pk):
        assert DataSource.objects.get(pk=source.pk).config["base_url"] == "http://10.1.2.3/api"


def test_editing_keeps_stored_secrets_and_the_operators_network_flag(acme):
    source = source_create(
        tenant_id=acme.tenant.pk,
        kind="slack",
        name="Live Slack",
        project_ids=[acme.project.pk],
        config={
            "token": "xoxb-stored-secret",
            "channels": ["C01"],
            "base_url": "http://127.0.0.1:9/api/",
            "allow_private_network": True,
        },
    )
    admin = _admin(acme)
    page = admin.get(f"/manage/sources/{source.slug}/").content.decode()
    assert "xoxb-stored-secret" not in page and "Set; leave blank to keep it." in page
    form = {
        "name": "Renamed Slack",
        "projects": [str(acme.project.pk)],
        "sync_interval_minutes": 120,
        "config-token": "",
        "config-channels": "C01\nC02",
        "config-base_url": "http://127.0.0.1:9/api/",
        "config-conversation_gap_minutes": 30,
        "config-page_size": 200,
        "config-rate_limit_retries": 10,
        "action": "save",
    }
    assert admin.post(f"/manage/sources/{source.slug}/", form).status_code == 302
    with tenant_context(acme.tenant.pk):
        after = DataSource.objects.get(pk=source.pk)
        [update] = AuditEvent.objects.filter(action="source.update")
        attached = ProjectSource.objects.filter(source=after).exists()
    assert after.config["token"] == source.config["token"] and is_encrypted(after.config["token"])
    assert after.config["allow_private_network"] is True and after.config["channels"] == ["C01", "C02"]
    assert (after.name, after.sync_interval_minutes, after.enabled, attached) == ("Renamed Slack", 120, False, True)
    assert set(update.data["changed"]) == {"channels", "name", "sync_interval_minutes", "enabled"}
    assert "xoxb" not in str(update.data)


def test_source_pages_are_closed_to_members_outsiders_and_other_organizations(acme, make_tenant):
    from django.contrib.auth import get_user_model

    from projects.services import membership_create

    source = source_create(tenant_id=acme.tenant.pk, kind="docs", name="Acme docs", config={"path": "/tmp"})
    member = get_user_model().objects.create_user("mg-member", "", "pw-" + "m" * 12)
    membership_create(tenant_id=acme.tenant.pk, user=member)
    other = make_tenant("mgother")
    paths = ["/manage/sources/", "/manage/sources/new/docs/", f"/manage/sources/{source.slug}/"]
    as_member, as_other = Client(), Client()
    as_member.force_login(member)
    as_other.force_login(other.admin)
    for path in paths:
        assert as_member.get(path).status_code == 404
        assert Client().get(path).status_code == 302
    assert as_other.get(f"/manage/sources/{source.slug}/").status_code == 404
    assert "Acme docs" not in as_other.get("/manage/sources/").content.decode()
    assert as_other.post(f"/manage/sources/{source.slug}/", _docs_form(other)).status_code == 404


def test_admins_manage_projects_members_and_attached_sources(acme, make_tenant):
    from django.contrib.auth import get_user_model

    from projects.models import Project
    from projects.selectors import ScopeNotFound
    from projects.services import membership_create

    admin = _admin(acme)
    assert admin.post("/manage/projects/", {"name": "Finance", "visibility": "members"}).status_code == 302
    source = source_create(tenant_id=acme.tenant.pk, kind="docs", name="Ledger docs", config={"path": "/tmp"})
    member = get_user_model().objects.create_user("mg-viewer", "", "pw-" + "v" * 12)
    membership_create(tenant_id=acme.tenant.pk, user=member)
    with pytest.raises(ScopeNotFound):
        scope_for_user(member, "finance")
    admin.post("/manage/projects/finance/", {"action": "member_add", "user": member.pk, "role": "viewer"})
    admin.post("/manage/projects/finance/", {"action": "sources", "sources": [source.pk]})
    assert scope_for_user(member, "finance").allowed_source_ids == (source.pk,)
    admin.post("/manage/projects/finance/", {"action": "member_remove", "user": member.pk})
    with pytest.raises(ScopeNotFound):
        scope_for_user(member, "finance")
    admin.post("/manage/projects/finance/", {"action": "visibility", "visibility": "tenant"})
    with tenant_context(acme.tenant.pk):
        assert Project.objects.get(slug="finance").visibility == "tenant"
        actions = list(
            AuditEvent.objects.filter(action__startswith="project.", data__project="finance")
            .order_by("id")
            .values_list("action", flat=True)
        )
    assert actions == [
        "project.create",
        "project.member_add",
        "project.sources",
        "project.member_remove",
        "project.visibility",
    ]
    # Another organization's admin: no such project, and no way to add their people to it.
    other = make_tenant("mgprj")
    outsider = Client()
    outsider.force_login(other.admin)
    assert outsider.get("/manage/projects/finance/").status_code == 404
    forged = admin.post(
        "/manage/projects/finance/", {"action": "member_add", "user": other.admin.pk, "role": "editor"}, follow=True
    )
    assert "no such member of this organization" in forged.content.decode()


def test_credentials_in_an_operators_url_are_never_shown_and_survive_an_edit(acme):
    url = "https://deploy:ghp_GITSECRET@140.82.112.3/acme/repo.git"
    source = source_create(tenant_id=acme.tenant.pk, kind="git", name="Repo", config={"path": url})
    admin = _admin(acme)
    page = admin.get(f"/manage/sources/{source.slug}/").content.decode()
    assert "ghp_GITSECRET" not in page and "https://***@140.82.112.3/acme/repo.git" in page
    form = {
        "name": "Repo renamed",
        "projects": [str(acme.project.pk)],
        "sync_interval_minutes": 60,
        "enabled": "on",
        "config-path": "https://***@140.82.112.3/acme/repo.git",
        "config-max_commits": 2000,
        "config-max_file_bytes": 1_000_000,
        "action": "save",
    }
    assert admin.post(f"/manage/sources/{source.slug}/", form).status_code == 302
    with tenant_context(acme.tenant.pk):
        assert DataSource.objects.get(pk=source.pk).config["path"] == url


def test_an_awkward_zip_is_refused_with_a_reason_not_a_server_error(acme):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("page.md", "# one\n")
        zf.writestr("page.md/inner.md", "# a file where a folder must go\n")
    answer = _post(_admin(acme), "/manage/sources/new/docs/", _docs_form(acme), upload=("odd.zip", buffer.getvalue()))
    assert answer.status_code == 200 and "the ZIP cannot be unpacked" in answer.content.decode()


def test_sources_with_one_name_get_distinct_slugs(acme, settings):
    from sources.services.managed import managed_source_create, tenant_files_root

    folder = tenant_files_root(acme.tenant) / "docs"
    folder.mkdir()
    slugs = [
        managed_source_create(tenant_id=acme.tenant.pk, kind="docs", name=name, config={"path": "docs"}).slug
        for name in ("Docs", "Docs 2", "Docs")
    ]
    assert len(set(slugs)) == 3


def test_the_form_lets_an_upload_stand_for_the_path_and_refuses_a_folder_that_is_not_there(acme):
    admin = _admin(acme)
    page = admin.get("/manage/sources/new/docs/").content.decode()
    path_input = re.search(r'<input[^>]*name="config-path"[^>]*>', page).group(0)
    assert "required" not in path_input  # the browser lets an upload stand for it
    missing = admin.post("/manage/sources/new/docs/", _docs_form(acme, **{"config-path": "handbook"}))
    assert "is not among your organization" in missing.content.decode()
    empty = admin.post("/manage/sources/new/docs/", _docs_form(acme))
    assert "Field required" in empty.content.decode() or "This field is required" in empty.content.decode()
    with tenant_context(acme.tenant.pk):
        assert not DataSource.objects.exists()
    # A tested upload is not kept, and the page says so.
    tested = _post(
        admin,
        "/manage/sources/new/docs/",
        {**_docs_form(acme), "action": "test"},
        upload=("h.zip", _zip({"a.md": f"# A\n\n{PAGE}\n"})),
    )
    assert "choose it again when you save" in tested.content.decode()
    # The stored path is shown relative to the organization's files, never the server's folders.
    _post(admin, "/manage/sources/new/docs/", _docs_form(acme), upload=("h.zip", _zip({"a.md": "# A\n"})))
    with tenant_context(acme.tenant.pk):
        source = DataSource.objects.get()
    edit = admin.get(f"/manage/sources/{source.slug}/").content.decode()
    assert source.config["path"] not in edit and 'value="uploads/' in edit
    assert "e.g." not in re.sub(r"e\.g\. \S", "", edit)  # help sentences are not cut at "e.g."


def test_the_portals_own_not_found_page_answers_for_manage_pages(make_tenant):
    from django.contrib.auth import get_user_model

    from projects.services import membership_create

    tenant = make_tenant("mg404")
    member = get_user_model().objects.create_user("mg404-member", "", "pw-" + "m" * 12)
    membership_create(tenant_id=tenant.tenant.pk, user=member)
    client = Client()
    client.force_login(member)
    page = client.get("/manage/sources/")
    assert page.status_code == 404 and "no such page" in page.content.decode() and "<header>" in page.content.decode()


def test_save_refuses_what_test_connection_refuses_and_keeps_nothing(acme, settings):
    """A folder that is no Slack export, or a file that is no ZIP, is refused when saved, not found
    at the first sync; the message names the problem without the server's folders."""
    from sources.services.managed import tenant_files_root

    admin = _admin(acme)
    (tenant_files_root(acme.tenant) / "handbook").mkdir()
    (tenant_files_root(acme.tenant) / "handbook" / "a.md").write_text("# A\n")
    slack_form = {
        "name": "Chat",
        "projects": [str(acme.project.pk)],
        "sync_interval_minutes": 60,
        "enabled": "on",
        "action": "save",
    }
    not_export = admin.post("/manage/sources/new/slack_export/", {**slack_form, "config-path": "handbook"})
    body = not_export.content.decode()
    assert not_export.status_code == 200 and "channels.json" in body
    assert str(tenant_files_root(acme.tenant)) not in body
    not_zip = _post(admin, "/manage/sources/new/slack_export/", slack_form, upload=("export.zip", b"not a zip"))
    assert not_zip.status_code == 200 and "ZIP" in not_zip.content.decode()
    with tenant_context(acme.tenant.pk):
        assert not DataSource.objects.exists()
    uploads = tenant_files_root(acme.tenant) / "uploads"
    assert not uploads.exists() or not any(p.is_file() for p in uploads.rglob("*"))  # the refused upload is gone


def test_a_source_needs_a_project_and_a_link_prefix_that_is_a_web_address(acme):
    admin = _admin(acme)
    archive = _zip({"a.md": f"# A\n\n{PAGE}\n"})
    no_project = _post(admin, "/manage/sources/new/docs/", _docs_form(acme, projects=[]), upload=("a.zip", archive))
    assert "Choose at least one project" in no_project.content.decode()
    # Testing writes nothing, so it needs no project; the new-source form starts in the default one.
    tested = _post(
        admin,
        "/manage/sources/new/docs/",
        {**_docs_form(acme, projects=[]), "action": "test"},
        upload=("a.zip", archive),
    )
    assert "Connected:" in tested.content.decode() and "Choose at least one project" not in tested.content.decode()
    fresh = admin.get("/manage/sources/new/docs/").content.decode()
    assert re.search(rf'value="{acme.project.pk}"[^>]*checked', fresh), "the default project is preselected"
    script = _post(
        admin,
        "/manage/sources/new/docs/",
        _docs_form(acme, **{"config-url_base": "javascript:alert(1)"}),
        upload=("a.zip", archive),
    )
    assert "must be an http:// or https:// address" in script.content.decode()
    with tenant_context(acme.tenant.pk):
        assert not DataSource.objects.exists()
    saved = _post(
        admin,
        "/manage/sources/new/docs/",
        _docs_form(acme, **{"config-url_base": "https://docs.acme.test/"}),
        upload=("a.zip", archive),
    )
    assert saved.status_code == 302
    with tenant_context(acme.tenant.pk):
        assert DataSource.objects.get().config["url_base"].startswith("https://docs.acme.test")


def test_an_admin_deletes_a_source_with_its_rows_and_upload_and_no_one_else_can(acme, make_tenant):
    from django.contrib.auth import get_user_model

    from projects.services import membership_create
    from sources.models import Document
    from sources.services.managed import tenant_files_root

    plain = get_user_model().objects.create_user("mg-del-member", "", "pw-" + "d" * 12)
    membership_create(tenant_id=acme.tenant.pk, user=plain)
    as_member = Client()
    as_member.force_login(plain)

    admin = _admin(acme)
    _post(admin, "/manage/sources/new/docs/", _docs_form(acme), upload=("h.zip", _zip({"k.md": f"# Kelp\n\n{PAGE}\n"})))
    with tenant_context(acme.tenant.pk):
        source = DataSource.objects.get()
    assert source_ingest(tenant_id=acme.tenant.pk, source_id=source.pk).status == "succeeded"
    url = f"/manage/sources/{source.slug}/delete/"
    other = make_tenant("mgdelother")
    for outsider in (_admin(other), as_member):
        assert outsider.get(url).status_code == 404 and outsider.post(url).status_code == 404
    asked = admin.get(url).content.decode()
    with tenant_context(acme.tenant.pk):
        rows = Document.objects.filter(source=source).count()
    assert rows and f"the {rows} rows" in asked
    assert admin.post(url).status_code == 302
    with tenant_context(acme.tenant.pk):
        assert not DataSource.objects.exists() and not Document.objects.exists()
        [deleted] = AuditEvent.objects.filter(action="source.delete")
    assert deleted.actor_id == acme.admin.pk and deleted.data["rows"] == rows
    assert not any(p.is_file() for p in (tenant_files_root(acme.tenant) / "uploads").rglob("*"))
    assert not any(PAGE in h.content for h in hybrid_search("kelp harvest", scope_for_user(acme.admin), limit=5).hits)


def test_deleting_a_source_keeps_an_upload_another_source_still_reads(acme):
    from sources.services.managed import managed_source_create, managed_source_delete, shown_path

    admin = _admin(acme)
    _post(admin, "/manage/sources/new/docs/", _docs_form(acme, name="First"), upload=("a.zip", _zip({"a.md": "# A\n"})))
    with tenant_context(acme.tenant.pk):
        first = DataSource.objects.get(slug="first")
    second = managed_source_create(
        tenant_id=acme.tenant.pk,
        kind="docs",
        name="Second",
        config={"path": shown_path(first.config["path"], acme.tenant)},
        project_ids=[acme.project.pk],
    )
    managed_source_delete(tenant_id=acme.tenant.pk, source_id=second.pk)
    assert Path(first.config["path"]).is_dir()  # the first source still reads it
    managed_source_delete(tenant_id=acme.tenant.pk, source_id=first.pk)
    assert not Path(first.config["path"]).exists()  # now no source does


def test_a_stored_scheme_less_link_prefix_still_syncs_and_an_edit_fixes_a_refused_one(acme):
    from sources.services.managed import managed_source_update, tenant_files_root

    (tenant_files_root(acme.tenant) / "docs").mkdir()
    (tenant_files_root(acme.tenant) / "docs" / "a.md").write_text(f"# A\n\n{PAGE}\n")
    path = str(tenant_files_root(acme.tenant) / "docs")
    legacy = source_create(
        tenant_id=acme.tenant.pk,
        kind="docs",
        name="Legacy",
        project_ids=[acme.project.pk],
        config={"path": path, "url_base": "docs.acme.test"},
    )
    assert source_ingest(tenant_id=acme.tenant.pk, source_id=legacy.pk).status == "succeeded"
    with tenant_context(acme.tenant.pk):  # a value an operator stored before links were checked
        DataSource.objects.filter(pk=legacy.pk).update(config={"path": path, "url_base": "javascript:alert(1)"})
    assert source_ingest(tenant_id=acme.tenant.pk, source_id=legacy.pk).status == "failed"
    fixed = managed_source_update(
        tenant_id=acme.tenant.pk,
        source_id=legacy.pk,
        name="Legacy",
        config={"path": path, "url_base": "https://docs.acme.test"},
        project_ids=[acme.project.pk],
        sync_interval_minutes=60,
        enabled=True,
    )
    assert source_ingest(tenant_id=acme.tenant.pk, source_id=fixed.pk).status == "succeeded"


def test_errors_name_no_server_folder_on_the_manage_pages_or_the_api(acme, settings):
    from sources.services.managed import shown_text, tenant_files_root

    root = tenant_files_root(acme.tenant)
    assert shown_text(f"'{root}/uploads/x/export.zip' is no ZIP") == "'uploads/x/export.zip' is no ZIP"
    assert shown_text(f"'{root}' is empty") == "'.' is empty"
    assert (
        shown_text(f"git fetch failed in {Path(settings.KB_WORKDIR).resolve()}/git/abc")
        == "git fetch failed in git/abc"
    )
    # a slug sharing another's prefix is not cut short
    other = Path(settings.KB_TENANT_FILES_ROOT).resolve() / f"{acme.tenant.slug}c" / "secret.md"
    assert shown_text(str(other)) == "secret.md"
