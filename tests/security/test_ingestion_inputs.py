"""Hostile data-source content and configs: symlinks, huge pages, NUL, bad UTF-8, ZIP member names."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import zipfile

import pytest

from kbportal.tenancy import tenant_context
from sources.connectors.base import ConnectorError
from sources.models import Document
from sources.services import source_create, source_ingest

SECRET = "SECRET_KEY=do-not-index-me-4242"


@pytest.fixture
def tenant(make_tenant):
    return make_tenant("atk-ingest")


def _ingest(tenant, kind, config, name="src"):
    source = source_create(
        tenant_id=tenant.tenant.pk, kind=kind, name=name, config=config, project_ids=[tenant.project.pk]
    )
    run = source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk)
    with tenant_context(tenant.tenant.pk):
        docs = list(Document.objects.filter(source_id=source.pk).values("external_id", "content", "path"))
    return run, docs


def _outside_secret(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "server_secret.txt").write_text(SECRET + "\n")
    return outside / "server_secret.txt"


# ---------- symlinks ------------------------------------------------------------------------------


def test_docs_folder_symlink_to_a_file_outside_is_not_indexed(tenant, tmp_path):
    """DEFECT: the docs connector reads symlinked *files* (only folder links are skipped), so a
    docs tree holding `notes.txt -> /path/to/var/secret_key` (or /etc/passwd) puts the target's
    contents in the index for every member of the tenant."""
    secret = _outside_secret(tmp_path)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Index\n\nHello docs.\n")
    os.symlink(secret, docs / "notes.txt")
    os.symlink("/etc/passwd", docs / "passwd.txt")
    run, rows = _ingest(tenant, "docs", {"path": str(docs)})
    assert run.status in {"succeeded", "partial"}, run.error
    leaked = [r["path"] for r in rows if SECRET in r["content"] or "root:x:0:0" in r["content"]]
    assert not leaked, f"files outside the docs folder were indexed: {leaked}"


def test_docs_folder_symlink_to_a_folder_outside_is_not_followed(tenant, tmp_path):
    secret = _outside_secret(tmp_path)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Index\n\nHello docs.\n")
    os.symlink(secret.parent, docs / "linked")
    run, rows = _ingest(tenant, "docs", {"path": str(docs), "glob": ["**/*"]})
    assert not any(SECRET in r["content"] for r in rows)


def test_jsonl_folder_symlink_to_a_file_outside_is_not_indexed(tenant, tmp_path):
    """Same class as the docs defect, for the JSON documents connector's folder mode."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "hr.jsonl").write_text(json.dumps({"id": "x", "title": "t", "content": SECRET}) + "\n")
    folder = tmp_path / "records"
    folder.mkdir()
    (folder / "ok.jsonl").write_text(json.dumps({"id": "ok", "title": "ok", "content": "fine"}) + "\n")
    os.symlink(outside / "hr.jsonl", folder / "linked.jsonl")
    run, rows = _ingest(tenant, "jsonl", {"path": str(folder)})
    assert not any(SECRET in r["content"] for r in rows)


def test_git_repo_with_committed_symlink_to_etc_passwd_is_ignored(tenant, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "a",
        "GIT_AUTHOR_EMAIL": "a@x",
        "GIT_COMMITTER_NAME": "a",
        "GIT_COMMITTER_EMAIL": "a@x",
    }
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "app.py").write_text("def main():\n    return 1\n")
    os.symlink("/etc/passwd", repo / "passwd.py")
    os.symlink("/etc/passwd", repo / "README.md")
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "init"], check=True, env=env)
    run, rows = _ingest(tenant, "git", {"path": str(repo)})
    assert run.status in {"succeeded", "partial"}, run.error
    assert not any("root:x:0:0" in r["content"] for r in rows)


# ---------- bad bytes, huge files -----------------------------------------------------------------


def test_docs_nul_and_invalid_utf8_are_skipped_not_fatal(tenant, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.md").write_text("# Good\n\nA good page about deployments.\n")
    (docs / "nul.md").write_bytes(b"# Nul\n\nbad \x00 byte\n")
    (docs / "latin1.md").write_bytes("# Caf\xe9\n".encode("latin-1"))
    run, rows = _ingest(tenant, "docs", {"path": str(docs)})
    assert run.status == "partial"
    assert {i["item"] for i in run.skipped_items} == {"nul.md", "latin1.md"}
    assert any(r["path"] == "good.md" for r in rows)


def test_jsonl_nul_and_surrogates_are_cleaned(tenant, tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(
        json.dumps({"id": "a\u0000b", "title": "t\u0000", "content": "c\ud800d", "url": "x\u0000"})
        + "\n"
        + "not json\n"
        + "[1,2]\n"
    )
    run, rows = _ingest(tenant, "jsonl", {"path": str(path)})
    assert run.status == "partial", run.error
    assert len(rows) == 1


def _georgian_words(n: int, seed: int = 7) -> str:
    """Distinct 6-letter words in a 3-byte-per-letter script (Georgian)."""
    rnd = random.Random(seed)
    letters = "აბგდევზთიკლმნოპჟრსტუფქღყშჩცძწჭხჯჰ"
    return " ".join("".join(rnd.choice(letters) for _ in range(6)) for _ in range(n))


@pytest.mark.slow
def test_one_huge_multibyte_page_does_not_fail_the_whole_source(tenant, tmp_path):
    """DEFECT: MAX_CONTENT_CHARS (400 000 *characters*) is meant to keep a row's tsvector under
    PostgreSQL's 1 MB limit, but with multi-byte text 400 000 characters of distinct words make
    a bigger tsvector: the batch insert raises and the whole run fails, every run, so one file
    keeps every other page of the source out of the index."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a-good.md").write_text("# Good page\n\nHow to deploy the billing service.\n")
    (docs / "z-huge.txt").write_text(_georgian_words(70_000))  # ~490 000 characters, ~1.3 MB UTF-8
    run, rows = _ingest(tenant, "docs", {"path": str(docs), "max_section_chars": 100_000})
    assert run.status != "failed", run.error
    assert any(r["path"] == "a-good.md" for r in rows)


def test_huge_single_line_ascii_file(tenant, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "big.txt").write_text("x" * 3_000_000)
    run, rows = _ingest(tenant, "docs", {"path": str(docs)})
    assert run.status != "failed", run.error


# ---------- Slack ZIP member names ----------------------------------------------------------------


def test_slack_zip_with_dotdot_members_is_read_in_place(tenant, tmp_path):
    buf = io.BytesIO()
    msg = [{"ts": "1700000000.000100", "user": "U1", "text": "hello from general"}]
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("channels.json", json.dumps([{"id": "C1", "name": "general"}, {"id": "C2", "name": ".."}]))
        z.writestr("general/2023-11-14.json", json.dumps(msg))
        z.writestr("../2023-11-14.json", json.dumps([{"ts": "1700000001.0", "user": "U1", "text": "dotdot"}]))
        z.writestr("../../../tmp/atk-zip-slip/2023-11-14.json", json.dumps(msg))
        z.writestr("/abs/2023-11-14.json", json.dumps(msg))
    path = tmp_path / "export.zip"
    path.write_bytes(buf.getvalue())
    run, rows = _ingest(tenant, "slack_export", {"path": str(path)})
    assert run.status in {"succeeded", "partial"}, run.error
    assert not os.path.exists("/tmp/atk-zip-slip")
    assert not (tmp_path.parent / "2023-11-14.json").exists()


# ---------- configs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, config",
    [
        ("docs", {"path": 5}),
        ("docs", {"path": "/tmp", "evil": True}),
        ("docs", {"path": ["/tmp"]}),
        ("docs", {"path": "/tmp", "glob": []}),
        ("docs", {"path": "/tmp", "max_section_chars": -1}),
        ("git", {"path": ""}),
        ("git", {"path": "x", "branch": "--upload-pack=touch /tmp/atk-pwned"}),
        ("git", {"path": "x", "branch": "a", "ref": "b"}),
        ("jsonl", {"path": "x", "kind": "nonsense"}),
        ("slack_export", {"path": "x", "workspace_url": "javascript:alert(1)"}),
        ("slack_export", {"path": "x", "channels": []}),
        ("nope", {}),
    ],
)
def test_malformed_configs_are_refused_with_connector_error(tenant, kind, config):
    with pytest.raises(ConnectorError):
        source_create(tenant_id=tenant.tenant.pk, kind=kind, name=f"bad-{kind}", config=config)


@pytest.mark.parametrize("config", [None, [], "path=/tmp", 42])
def test_non_dict_configs_are_refused_with_connector_error(tenant, config):
    with pytest.raises(ConnectorError):
        source_create(tenant_id=tenant.tenant.pk, kind="docs", name="bad", config=config)


def test_git_ext_transport_is_never_run(tenant, tmp_path):
    marker = tmp_path / "pwned"
    for path in (f"ext::sh -c touch% {marker}", f"--upload-pack=touch {marker}", "fd::17"):
        source = source_create(tenant_id=tenant.tenant.pk, kind="git", name=f"g{hash(path)}", config={"path": path})
        run = source_ingest(tenant_id=tenant.tenant.pk, source_id=source.pk)
        assert run.status == "failed"
    assert not marker.exists()


def test_docs_config_path_traversal_reads_any_server_folder(tenant, tmp_path):
    """By design (operator-only configs): a docs path may name any folder the server can read.
    Recorded so a future tenant-facing source form does not inherit it silently."""
    _outside_secret(tmp_path)
    docs = tmp_path / "docs"
    docs.mkdir()
    run, rows = _ingest(tenant, "docs", {"path": str(docs / ".." / "outside"), "glob": ["*.txt"]})
    assert any(SECRET in r["content"] for r in rows)  # documents the behaviour; not a failure
