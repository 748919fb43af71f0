"""subsystem_index over real FastAPI files: which file does what, path and symbol questions, the
whole index, LLM summaries cached by content hash (through a loopback server), and scope."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from django.test import override_settings

from search.tools.subsystems import module_summaries, subsystem_index, subsystem_index_tool
from sources.selectors import QueryScope, scope_for_user
from tests.llm_server import FakeOpenAIServer, ServerError

FILES = [
    "fastapi/encoders.py",
    "fastapi/exceptions.py",
    "fastapi/background.py",
    "fastapi/concurrency.py",
    "fastapi/datastructures.py",
    "fastapi/responses.py",
    "fastapi/websockets.py",
    *[
        f"fastapi/security/{name}"
        for name in (
            "__init__.py",
            "api_key.py",
            "base.py",
            "http.py",
            "oauth2.py",
            "open_id_connect_url.py",
            "utils.py",
        )
    ],
]


@dataclass
class ModulesKB:
    scope: QueryScope
    package: Path


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=Dev", "-c", "user.email=dev@example.com", *args],
        check=True,
        capture_output=True,
    )


def _repo(root: Path, package: Path, files: list[str]) -> Path:
    """A git repository holding real FastAPI 0.141.1 files at their own paths."""
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(package / name, root / name)
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "FastAPI files")
    return root


@pytest.fixture(scope="module")
def modules_kb(django_db_setup, django_db_blocker, tmp_path_factory) -> ModulesKB:
    from projects.services import tenant_onboard
    from search.evaluation import fastapi_source_checkout
    from sources.services import source_create, source_ingest

    package = fastapi_source_checkout()
    repo = _repo(tmp_path_factory.mktemp("repo"), package, FILES)
    with django_db_blocker.unblock():
        t = tenant_onboard(name="Mods", slug="si-mods", admin_username="si-mods-admin", admin_password="m" * 12)
        source = source_create(
            tenant_id=t.tenant.pk, kind="git", name="FastAPI", config={"path": str(repo)}, project_ids=[t.project.pk]
        )
        assert source_ingest(tenant_id=t.tenant.pk, source_id=source.pk).status == "succeeded"
        return ModulesKB(scope=scope_for_user(t.admin), package=package)


@pytest.mark.slow
@pytest.mark.django_db
def test_the_file_a_question_describes_comes_first(modules_kb):
    top = subsystem_index(query="which module implements OAuth2 password login forms?", scope=modules_kb.scope)
    assert top[0].path == "fastapi/security/oauth2.py"
    assert "OAuth2PasswordRequestForm" in top[0].symbols and "OAuth2PasswordRequestForm" in top[0].summary
    top = subsystem_index(query="how are background tasks run after a response?", scope=modules_kb.scope)
    assert top[0].path == "fastapi/background.py"


@pytest.mark.slow
@pytest.mark.django_db
def test_named_paths_modules_and_symbols(modules_kb):
    top = subsystem_index(query="what does the encoders module do?", scope=modules_kb.scope)
    assert top[0].path == "fastapi/encoders.py" and top[0].summary_kind == "extractive"
    assert top[0].summary.startswith("fastapi/encoders.py\n") and "jsonable_encoder" in top[0].summary
    assert top[0].lines == len((modules_kb.package / "fastapi/encoders.py").read_text().splitlines())
    overview = subsystem_index(query="give me an overview of fastapi/security", scope=modules_kb.scope, limit=5)
    assert all(m.path.startswith("fastapi/security/") for m in overview)
    dotted = subsystem_index(query="what is in fastapi.security.api_key?", scope=modules_kb.scope)
    assert dotted[0].path == "fastapi/security/api_key.py"
    named = subsystem_index(query="which file defines get_authorization_scheme_param?", scope=modules_kb.scope)
    assert named[0].path == "fastapi/security/utils.py"


@pytest.mark.slow
@pytest.mark.django_db
def test_the_whole_index_lists_every_indexed_file(modules_kb):
    security = module_summaries(scope=modules_kb.scope, prefix="fastapi/security/")
    on_disk = sorted(f"fastapi/security/{p.name}" for p in (modules_kb.package / "fastapi/security").glob("*.py"))
    assert [m.path for m in security] == on_disk
    everything = module_summaries(scope=modules_kb.scope)
    assert sorted(m.path for m in everything) == sorted(FILES)
    assert all(m.summary and m.content_hash and m.as_dict()["path"] == m.path for m in everything)


@pytest.mark.slow
@pytest.mark.django_db
def test_pipeline_rows_are_summaries_and_unrelated_questions_match_no_path(modules_kb):
    rows = subsystem_index_tool(query="what does the encoders module do?", scope=modules_kb.scope, limit=10)
    assert 1 <= len(rows) <= 5 and rows[0].path == "fastapi/encoders.py"
    assert rows[0].kind == "code_file" and rows[0].tool == "subsystem_index" and rows[0].is_relevant
    assert rows[0].metadata["summary_kind"] == "extractive" and "jsonable_encoder" in rows[0].metadata["symbols"]
    assert [r.score for r in rows] == sorted((r.score for r in rows), reverse=True)
    # An unrelated question names no path or symbol and is far from every summary.
    unrelated = subsystem_index(query="how many vacation days do employees get?", scope=modules_kb.scope)
    assert unrelated and all(not {"path", "symbols"} & set(m.hit.ranks) for m in unrelated)
    assert all((m.hit.similarity or 0.0) < 0.35 for m in unrelated)


@pytest.mark.slow
@pytest.mark.django_db
def test_other_tenants_and_forged_scopes_see_nothing(modules_kb, make_tenant):
    outsider = scope_for_user(make_tenant("si-outsider").admin)
    assert subsystem_index(query="encoders module", scope=outsider) == []
    forged = replace(outsider, allowed_source_ids=modules_kb.scope.allowed_source_ids)
    assert subsystem_index(query="encoders module", scope=forged) == []
    assert module_summaries(scope=forged) == []


@pytest.mark.slow
@pytest.mark.django_db
def test_llm_summaries_are_cached_by_content_hash_and_redone_when_the_file_changes(make_tenant, settings, tmp_path):
    from search.evaluation import fastapi_source_checkout
    from sources.services import source_create, source_ingest

    package = fastapi_source_checkout()
    settings.KB_WORKDIR = tmp_path / "work"
    repo = _repo(tmp_path / "repo", package, ["fastapi/encoders.py", "fastapi/background.py"])
    t = make_tenant("si-llm")
    source = source_create(
        tenant_id=t.tenant.pk, kind="git", name="Two", config={"path": str(repo)}, project_ids=[t.project.pk]
    )
    assert source_ingest(tenant_id=t.tenant.pk, source_id=source.pk).status == "succeeded"
    scope = scope_for_user(t.admin)
    asked: list[str] = []
    fail = {"on": False}

    def responder(body):
        user = body["messages"][-1]["content"]
        path = user.splitlines()[0].removeprefix("File: ")
        asked.append(path)
        assert "def " in user  # the file's own content is what the LLM reads
        if fail["on"]:
            raise ServerError(500, "model unavailable")
        return f"Summary of {path} ({len(asked)})."

    question = "what do the encoders and background modules do?"
    with (
        FakeOpenAIServer(responder) as server,
        override_settings(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="test", KB_LLM_MODEL="test-model"),
    ):
        first = {m.path: m for m in subsystem_index(query=question, scope=scope)}
        assert sorted(asked) == ["fastapi/background.py", "fastapi/encoders.py"]
        assert {m.summary_kind for m in first.values()} == {"llm"}
        assert first["fastapi/encoders.py"].summary.startswith("Summary of fastapi/encoders.py")
        rows = subsystem_index_tool(query=question, scope=scope)
        assert len(asked) == 2  # cached: no new call
        assert all(r.text.startswith("Summary of") and r.path in r.text for r in rows)

        encoders = (repo / "fastapi/encoders.py").read_text()
        (repo / "fastapi/encoders.py").write_text('"""Encoders, edited."""\n' + encoders)
        _git(repo, "commit", "-qam", "edit encoders")
        assert source_ingest(tenant_id=t.tenant.pk, source_id=source.pk).status == "succeeded"
        again = {m.path: m for m in subsystem_index(query=question, scope=scope)}
        assert asked[2:] == ["fastapi/encoders.py"]  # only the changed file is summarised again
        assert again["fastapi/background.py"].summary == first["fastapi/background.py"].summary

        _git(repo, "commit", "-q", "--allow-empty", "-m", "noop")
        (repo / "fastapi/background.py").write_text("# edited\n" + (repo / "fastapi/background.py").read_text())
        _git(repo, "commit", "-qam", "edit background")
        assert source_ingest(tenant_id=t.tenant.pk, source_id=source.pk).status == "succeeded"
        fail["on"] = True
        failed = {m.path: m for m in subsystem_index(query=question, scope=scope)}
        assert failed["fastapi/background.py"].summary_kind == "extractive"
        assert failed["fastapi/background.py"].summary.startswith("fastapi/background.py\n")
