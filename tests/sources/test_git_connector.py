"""The git connector, end to end: real git repositories in tmp_path, real PostgreSQL, real embedder.

Repositories are built with the git CLI; each commit gets fixed author/committer names and
dates so dates and authors can be asserted exactly.
"""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from kbportal.tenancy import tenant_context
from sources.connectors.base import ConnectorError, IngestReport
from sources.connectors.git.chunker import chunk_file
from sources.connectors.registry import build_connector
from sources.models import DataSource, Document, IngestionRun
from sources.services import source_create, source_ingest, source_update_config

# -- repository helpers ------------------------------------------------------------------------


def git(repo: Path, *args: str, date: str = "2024-03-01T10:00:00+01:00", author: str = "Ada Lovelace") -> str:
    """Run git in ``repo`` isolated from the machine's git configuration; returns stdout."""
    env = {
        **os.environ,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": author,
        "GIT_AUTHOR_EMAIL": author.split()[0].lower() + "@example.com",
        "GIT_COMMITTER_NAME": author,
        "GIT_COMMITTER_EMAIL": author.split()[0].lower() + "@example.com",
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_DATE": date,
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def write(repo: Path, files: dict[str, str | bytes | None]) -> None:
    """Write (str: UTF-8, bytes: raw) or delete (None) files under ``repo``."""
    for name, content in files.items():
        target = repo / name
        if content is None:
            target.unlink()
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content, encoding="utf-8")


def commit(repo: Path, message: str, files: dict[str, str | bytes | None], **kwargs: str) -> str:
    """Apply ``files``, commit everything with ``message``; returns the new commit's sha."""
    write(repo, files)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message, **kwargs)
    return git(repo, "rev-parse", "HEAD")


def new_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    return path


def line_of(text: str, needle: str) -> int:
    """1-based number of the first line of ``text`` containing ``needle``."""
    for number, line in enumerate(text.split("\n"), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in text")


def lines(text: str, start: int, end: int) -> str:
    return "\n".join(text.split("\n")[start - 1 : end])


# -- source helpers ----------------------------------------------------------------------------


@pytest.fixture
def tenant_id(make_tenant) -> int:
    return make_tenant("acme").tenant.pk


def make_source(tenant_id: int, repo: Path | str, **options) -> DataSource:
    config = {"path": str(repo), **options.pop("config", {})}
    return source_create(tenant_id=tenant_id, kind="git", name=options.pop("name", "Shop"), config=config, **options)


def ingest(tenant_id: int, source: DataSource) -> IngestionRun:
    return source_ingest(tenant_id=tenant_id, source_id=source.pk)


def rows(tenant_id: int, source: DataSource, **filters) -> dict[str, Document]:
    with tenant_context(tenant_id):
        return {d.external_id: d for d in Document.objects.filter(source=source, **filters)}


APP_PY = '''"""Shop helpers: carts and taxes."""

import math

RATE = 0.2


class Cart:
    """A shopping cart."""

    currency = "EUR"

    def add(self, item, qty=1):
        """Add an item."""
        self.items.append((item, qty))

    def total(self):
        return sum(q for _, q in self.items)


# Rounded up, as the tax office wants.
def tax(amount):
    """Tax on an amount."""
    return math.ceil(amount * RATE)


if __name__ == "__main__":
    print(tax(10))
'''


def ledger_py() -> str:
    """A module with a class longer than the small-class limit (~100 lines), so it is split."""
    steps = "\n".join(
        f'''    def step_{i}(self, value):
        """Step {i} of the ledger."""
        total = value
        for _ in range(3):
            total += {i}
        return total
'''
        for i in range(14)
    )
    return f'''import decimal


class Ledger(object):
    """Books every step."""

    precision = 2
    rounding = decimal.ROUND_HALF_UP

{steps}

def close(ledger):
    return ledger.step_0(0)
'''


# -- 1. chunking a Python file -------------------------------------------------------------------


def test_python_file_is_chunked_by_symbol_with_exact_lines_urls_and_parents(tenant_id, tmp_path):
    repo = new_repo(tmp_path / "shop")
    ledger = ledger_py()
    commit(repo, "Initial import", {"shop/app.py": APP_PY, "shop/ledger.py": ledger})
    source = make_source(tenant_id, repo)

    run = ingest(tenant_id, source)

    assert run.status == "succeeded", run.error
    docs = rows(tenant_id, source)
    app_chunks = sorted((d for d in docs.values() if d.parent_external_id == "shop/app.py"), key=lambda d: d.position)
    assert [(d.external_id, d.metadata["symbol_kind"]) for d in app_chunks] == [
        ("shop/app.py#<module>", "module"),
        ("shop/app.py#Cart", "class"),
        ("shop/app.py#tax", "function"),
        ("shop/app.py#<module>~2", "module"),
    ]
    expected_lines = {
        "shop/app.py#<module>": (1, line_of(APP_PY, "RATE = 0.2")),
        "shop/app.py#Cart": (line_of(APP_PY, "class Cart"), line_of(APP_PY, "return sum(")),
        # The comment directly above the function belongs to it.
        "shop/app.py#tax": (line_of(APP_PY, "# Rounded up"), line_of(APP_PY, "return math.ceil")),
        "shop/app.py#<module>~2": (line_of(APP_PY, "if __name__"), line_of(APP_PY, "print(tax(10))")),
    }
    for doc in app_chunks:
        start, end = expected_lines[doc.external_id]
        assert (doc.start_line, doc.end_line) == (start, end), doc.external_id
        assert doc.content == lines(APP_PY, start, end)
        assert doc.url == f"shop/app.py#L{start}-L{end}"
        assert doc.kind == "code_chunk" and doc.path == "shop/app.py"

    tax = docs["shop/app.py#tax"]
    assert tax.title == "shop/app.py: tax"
    assert tax.metadata["signature"] == "def tax(amount):"
    assert tax.metadata["language"] == "python"
    assert tax.text.startswith("shop/app.py: tax\ndef tax(amount):\nTax on an amount.\n# Rounded up")
    assert tax.embedding is not None

    file_row = docs["shop/app.py"]
    assert file_row.kind == "code_file" and file_row.title == "shop/app.py"
    assert file_row.content == APP_PY
    assert file_row.text == "shop/app.py\nShop helpers: carts and taxes.\nclasses: Cart\nfunctions: tax"
    assert all(d.parent_id == file_row.pk for d in app_chunks)

    # The long class: a header chunk (signature, docstring, attributes), then one chunk per method.
    header = docs["shop/ledger.py#Ledger"]
    assert (header.start_line, header.end_line) == (line_of(ledger, "class Ledger"), line_of(ledger, "rounding ="))
    assert header.metadata["members"] == [f"step_{i}" for i in range(14)]
    step = docs["shop/ledger.py#Ledger.step_3"]
    assert step.title == "shop/ledger.py: Ledger.step_3"
    assert step.metadata["symbol_kind"] == "method"
    assert step.metadata["enclosing_signature"] == "class Ledger(object):"
    assert (step.start_line, step.end_line) == (line_of(ledger, "def step_3"), line_of(ledger, "def step_4") - 2)
    assert step.content.endswith("total += 3\n        return total")
    assert docs["shop/ledger.py#close"].metadata["symbol_kind"] == "function"
    ledger_chunks = [d for d in docs.values() if d.parent_external_id == "shop/ledger.py"]
    assert len(ledger_chunks) == 1 + 1 + 14 + 1  # imports, header, methods, close
    assert {d.parent_id for d in ledger_chunks} == {docs["shop/ledger.py"].pk}
    assert run.created == len(docs) == 2 + len(app_chunks) + len(ledger_chunks) + 1  # files, chunks, commit


def test_url_base_makes_web_links(tenant_id, tmp_path):
    repo = new_repo(tmp_path / "shop")
    sha = commit(repo, "Initial import", {"shop/app.py": APP_PY})
    source = make_source(tenant_id, repo, config={"url_base": "https://git.example.com/shop/"})

    assert ingest(tenant_id, source).status == "succeeded"

    docs = rows(tenant_id, source)
    start, end = line_of(APP_PY, "# Rounded up"), line_of(APP_PY, "return math.ceil")
    assert docs["shop/app.py#tax"].url == f"https://git.example.com/shop/shop/app.py#L{start}-L{end}"
    assert docs["shop/app.py"].url == "https://git.example.com/shop/shop/app.py"
    assert docs[f"commit:{sha}"].url == f"https://git.example.com/shop/commit/{sha}"


# -- 2. commits ----------------------------------------------------------------------------------


def test_commits_carry_author_files_dates_and_pull_request_numbers(tenant_id, tmp_path):
    repo = new_repo(tmp_path / "shop")
    first = commit(repo, "Initial import", {"shop/app.py": APP_PY}, date="2024-03-01T10:00:00+01:00")
    git(repo, "checkout", "-q", "-b", "feature")
    feature = commit(
        repo,
        "Add the pricing guide (#123)",
        {"docs/guide.md": "# Pricing\n\nPrices include tax.\n", "shop/app.py": APP_PY.replace("0.2", "0.25")},
        date="2024-03-02T09:30:00+00:00",
        author="Grace Hopper",
    )
    git(repo, "checkout", "-q", "main")
    git(
        repo,
        "merge",
        "-q",
        "--no-ff",
        "feature",
        "-m",
        "Merge pull request #45 from acme/feature",
        "-m",
        "Pricing guide.",
        date="2024-03-03T12:00:00-05:00",
    )
    merge = git(repo, "rev-parse", "HEAD")
    source = make_source(tenant_id, repo)

    run = ingest(tenant_id, source)

    assert run.status == "succeeded", run.error
    commits = rows(tenant_id, source, kind="commit")
    assert set(commits) == {f"commit:{first}", f"commit:{feature}", f"commit:{merge}"}

    added = commits[f"commit:{feature}"]
    assert added.title == "Add the pricing guide (#123)"
    assert added.metadata["pr_number"] == 123
    assert added.metadata["author_name"] == "Grace Hopper"
    assert added.metadata["author_email"] == "grace@example.com"
    assert added.metadata["files"] == ["docs/guide.md", "shop/app.py"]
    assert added.metadata["date"] == "2024-03-02T09:30:00+00:00"
    assert added.created_at == datetime(2024, 3, 2, 9, 30, tzinfo=UTC)
    assert added.content == "Add the pricing guide (#123)\n\nFiles changed:\ndocs/guide.md\nshop/app.py"
    assert added.url == f"commit/{feature}"

    merged = commits[f"commit:{merge}"]
    assert merged.metadata["pr_number"] == 45
    assert merged.metadata["parents"] == [first, feature]
    # A merge lists what it brought in, against its first parent.
    assert merged.metadata["files"] == ["docs/guide.md", "shop/app.py"]
    assert merged.content.startswith("Merge pull request #45 from acme/feature\n\nPricing guide.\n\nFiles changed:")
    assert merged.updated_at == datetime(2024, 3, 3, 12, 0, tzinfo=timezone(timedelta(hours=-5)))

    assert commits[f"commit:{first}"].metadata["pr_number"] is None
    assert commits[f"commit:{first}"].metadata["files"] == ["shop/app.py"]

    # A file row's date is that of the last commit touching it (the merge, on the main line).
    files = rows(tenant_id, source, kind="code_file")
    assert files["shop/app.py"].updated_at == merged.updated_at


def test_max_commits_keeps_the_newest(tenant_id, tmp_path):
    repo = new_repo(tmp_path / "shop")
    shas = [
        commit(repo, f"Change {i}", {"notes.txt": f"note {i}\n"}, date=f"2024-03-0{i}T10:00:00+00:00")
        for i in range(1, 5)
    ]
    source = make_source(tenant_id, repo, config={"max_commits": 2})

    assert ingest(tenant_id, source).status == "succeeded"

    assert set(rows(tenant_id, source, kind="commit")) == {f"commit:{shas[3]}", f"commit:{shas[2]}"}
    assert rows(tenant_id, source, kind="code_file")["notes.txt"].updated_at == datetime(2024, 3, 4, 10, tzinfo=UTC)


# -- 3. re-runs ----------------------------------------------------------------------------------


UTIL_PY = "def slug(text):\n    return text.lower()\n\n\ndef shout(text):\n    return text.upper()\n"


def connector_rows(repo: Path) -> dict[str, tuple[str, str]]:
    """external id -> (content hash, embedded text) of every row the connector yields for ``repo``."""
    connector = build_connector("git", {"path": str(repo)})
    return {row.external_id: (row.content_hash(), row.embed_text) for row in connector.iter_rows(IngestReport())}


def test_rows_change_only_where_the_repository_changed(tmp_path):
    repo = new_repo(tmp_path / "shop")
    commit(repo, "Initial import", {"shop/app.py": APP_PY, "shop/util.py": UTIL_PY, "README.md": "# Shop\n"})
    before = connector_rows(repo)
    assert connector_rows(repo) == before  # nothing run-dependent in any row

    changed = APP_PY.replace("math.ceil(amount * RATE)", "math.floor(amount * RATE)\n    # floor now")
    sha = commit(repo, "Round taxes down", {"shop/app.py": changed, "shop/util.py": None})
    after = connector_rows(repo)

    assert set(after) - set(before) == {f"commit:{sha}"}
    assert set(before) - set(after) == {"shop/util.py", "shop/util.py#slug", "shop/util.py#shout"}
    # The function grew a line, so the module block below it moved: new lines, same text.
    assert {key for key in before.keys() & after.keys() if before[key] != after[key]} == {
        "shop/app.py",
        "shop/app.py#tax",
        "shop/app.py#<module>~2",
    }
    assert {key for key in before.keys() & after.keys() if before[key][1] != after[key][1]} == {"shop/app.py#tax"}


def test_rerun_embeds_only_what_changed_and_removes_deleted_files(tenant_id, tmp_path):
    repo = new_repo(tmp_path / "shop")
    commit(repo, "Initial import", {"shop/app.py": APP_PY, "shop/util.py": UTIL_PY, "README.md": "# Shop\n"})
    source = make_source(tenant_id, repo)
    first = ingest(tenant_id, source)
    assert first.status == "succeeded", first.error
    before = rows(tenant_id, source)
    util_rows = {key for key in before if key.startswith("shop/util.py")}
    assert util_rows == {"shop/util.py", "shop/util.py#slug", "shop/util.py#shout"}

    # Change one function body (same number of lines) and delete a file.
    changed = APP_PY.replace("math.ceil(amount * RATE)", "math.floor(amount * RATE)")
    second_sha = commit(
        repo, "Round taxes down", {"shop/app.py": changed, "shop/util.py": None}, date="2024-04-01T08:00:00+00:00"
    )
    second = ingest(tenant_id, source)

    assert second.status == "succeeded", second.error
    # Embedded: the tax chunk (its text changed) and the new commit. The app.py file row's
    # content and date changed, but its embedded summary (path, docstring, symbols) did not.
    assert second.embedded == 2
    assert second.created == 1  # the commit
    assert second.updated == 2  # the tax chunk, the app.py file row
    assert second.deleted == len(util_rows)
    assert second.unchanged == second.seen - 3 == len(before) - len(util_rows) - 2
    after = rows(tenant_id, source)
    assert not any(key.startswith("shop/util.py") for key in after)
    assert "math.floor" in after["shop/app.py#tax"].content
    assert after["shop/app.py#tax"].pk == before["shop/app.py#tax"].pk  # updated in place
    assert after["shop/app.py"].text == before["shop/app.py"].text
    assert after["shop/app.py"].updated_at == datetime(2024, 4, 1, 8, tzinfo=UTC)
    assert f"commit:{second_sha}" in after

    # Nothing changed since: a third run writes and embeds nothing.
    third = ingest(tenant_id, source)
    assert (third.embedded, third.created, third.updated, third.deleted) == (0, 0, 0, 0)
    assert third.unchanged == third.seen == len(after)


def test_an_incremental_run_reads_only_the_files_whose_blob_changed(tenant_id, tmp_path):
    repo = new_repo(tmp_path / "shop")
    readme = "# Shop\n\nCarts and taxes.\n"
    commit(repo, "Initial import", {"shop/app.py": APP_PY, "shop/util.py": UTIL_PY, "README.md": readme})
    source = make_source(tenant_id, repo)
    assert ingest(tenant_id, source).status == "succeeded"
    before = rows(tenant_id, source)

    changed = APP_PY.replace("math.ceil(amount * RATE)", "math.floor(amount * RATE)")
    commit(
        repo,
        "Round taxes down; drop util; add a note",
        {"shop/app.py": changed, "shop/util.py": None, "NOTES.md": "# Notes\n\nFloor, not ceil.\n"},
    )

    # What the connector reads: the changed and the new file, not the unchanged README.
    connector = build_connector("git", {"path": str(repo)})
    connector.bind_source(tenant_id=tenant_id, source_id=source.pk)
    report = IngestReport()
    yielded = {row.external_id for row in connector.iter_rows(report)}
    files = {eid for eid in yielded if not eid.startswith("commit:")}
    assert {eid.split("#")[0] for eid in files} == {"shop/app.py", "NOTES.md"}
    assert len(yielded - files) == 2  # the two commits
    # Progress counts the three files, the README kept unread included.
    assert report.kept == {"README.md"} and report.done == report.total == 3 and report.unit == "files"

    run = ingest(tenant_id, source)
    assert run.status == "succeeded", run.error
    after = rows(tenant_id, source)
    assert not any(eid.startswith("shop/util.py") for eid in after)  # deleted files still go
    kept = {eid for eid in before if eid.startswith("README.md")}
    assert kept and all(after[eid].pk == before[eid].pk for eid in kept)  # kept rows stay as they were
    assert "NOTES.md" in after and "math.floor" in after["shop/app.py#tax"].content
    assert run.seen == len(after)  # kept rows count as seen (and unchanged)

    # New links change every file's rows: everything is read again. So does incremental: false.
    source_update_config(
        tenant_id=tenant_id,
        source_id=source.pk,
        config={"path": str(repo), "url_base": "https://git.example/shop/blob/main"},
    )
    connector = build_connector("git", {"path": str(repo), "url_base": "https://git.example/shop/blob/main"})
    connector.bind_source(tenant_id=tenant_id, source_id=source.pk)
    report = IngestReport()
    assert {r.external_id for r in connector.iter_rows(report)} >= {"README.md", "NOTES.md", "shop/app.py"}
    assert report.kept == set()
    assert ingest(tenant_id, source).status == "succeeded"
    assert rows(tenant_id, source)["README.md"].url.startswith("https://git.example/shop/blob/main/README.md")
    connector = build_connector(
        "git", {"path": str(repo), "incremental": False, "url_base": "https://git.example/shop/blob/main"}
    )
    connector.bind_source(tenant_id=tenant_id, source_id=source.pk)
    report = IngestReport()
    assert "README.md" in {r.external_id for r in connector.iter_rows(report)} and report.kept == set()


def test_url_source_is_cloned_then_fetched(tenant_id, tmp_path, settings):
    settings.KB_WORKDIR = tmp_path / "work"
    origin = new_repo(tmp_path / "origin")
    commit(origin, "Initial import", {"shop/app.py": APP_PY})
    source = make_source(tenant_id, f"file://{origin}")

    first = ingest(tenant_id, source)

    assert first.status == "succeeded", first.error
    clones = list((tmp_path / "work" / "git").glob("*/HEAD"))
    assert len(clones) == 1 and "origin" in clones[0].parent.name
    assert "shop/app.py#tax" in rows(tenant_id, source)

    later = commit(origin, "Add notes", {"NOTES.md": "# Notes\n\nShip on Fridays.\n"})
    second = ingest(tenant_id, source)

    assert second.status == "succeeded", second.error
    docs = rows(tenant_id, source)
    assert f"commit:{later}" in docs and "NOTES.md" in docs
    assert second.created == 3  # the file, its one chunk, the commit


# -- 4. bad input --------------------------------------------------------------------------------


def test_missing_path_fails_the_run_naming_the_path(tenant_id, tmp_path):
    missing = tmp_path / "nowhere"
    source = make_source(tenant_id, missing)

    run = ingest(tenant_id, source)

    assert run.status == "failed"
    assert run.error == f"git source path {missing} does not exist"


def test_plain_directory_is_not_a_git_repository(tenant_id, tmp_path):
    folder = tmp_path / "folder"
    write(folder, {"a.py": "x = 1\n"})
    source = make_source(tenant_id, folder)

    run = ingest(tenant_id, source)

    assert run.status == "failed"
    assert run.error == f"{folder} is not a git repository (no .git)"
    assert rows(tenant_id, source) == {}


def test_unknown_revision_and_empty_repository_fail_clearly(tenant_id, tmp_path):
    empty = new_repo(tmp_path / "empty")
    run = ingest(tenant_id, make_source(tenant_id, empty, name="Empty"))
    assert (run.status, run.error) == ("failed", f"git repository {empty} has no commits yet")

    repo = new_repo(tmp_path / "shop")
    commit(repo, "Initial import", {"a.py": "x = 1\n"})
    run = ingest(tenant_id, make_source(tenant_id, repo, config={"branch": "release"}))
    assert (run.status, run.error) == ("failed", f"revision 'release' not found in git repository {repo}")


def test_invalid_config_is_refused_when_the_source_is_created(tenant_id, tmp_path):
    with pytest.raises(ConnectorError, match=r"colour: Extra inputs are not permitted"):
        make_source(tenant_id, tmp_path, config={"colour": "blue"})
    with pytest.raises(ConnectorError, match=r"max_commits: Input should be greater than or equal to 0"):
        make_source(tenant_id, tmp_path, config={"max_commits": -1})
    with pytest.raises(ConnectorError, match=r"set either branch or ref, not both"):
        make_source(tenant_id, tmp_path, config={"branch": "main", "ref": "v1"})


def test_binary_undecodable_and_oversize_files_are_skipped_with_reasons(tenant_id, tmp_path):
    repo = new_repo(tmp_path / "shop")
    commit(
        repo,
        "Initial import",
        {
            "shop/app.py": APP_PY,
            "shop/blob.py": b"MAGIC\x00\x01\x02" * 100,
            "shop/legacy.py": "# Café in Zürich\nname = 'Müller'\n".encode("latin-1"),
            "data/big.txt": "word " * 1000,  # 5000 bytes
            "logo.png": b"\x89PNG\r\n\x1a\n\x00\x00",  # not a text type: ignored, not reported
        },
    )
    source = make_source(tenant_id, repo, config={"max_file_bytes": 4000})
    progress: list[tuple[int, int | None]] = []

    run = source_ingest(tenant_id=tenant_id, source_id=source.pk, progress=lambda *p: progress.append(p))

    assert run.status == "partial"
    assert run.skipped == 3
    assert run.skipped_items == [
        {"item": "data/big.txt", "reason": "file is 5000 bytes, over max_file_bytes (4000)"},
        {"item": "shop/blob.py", "reason": "binary file (NUL byte in the first 8 KB)"},
        {"item": "shop/legacy.py", "reason": "not UTF-8 text (byte 0xe9 at offset 5)"},
    ]
    paths = {d.path for d in rows(tenant_id, source).values() if d.path}
    assert paths == {"shop/app.py"}
    # Progress counts files read (the oversize one is never read): 3 in all, skipped ones too.
    # (Until the first file is done the service reports rows with no total.)
    counted = [done for done, total in progress if total is not None]
    assert {total for _, total in progress} <= {3, None}
    assert counted == sorted(counted) and progress[-1] == (3, 3)
    assert (run.units_done, run.units_total, run.units_label) == (3, 3, "files")


def test_failed_run_after_a_successful_one_keeps_the_rows(tenant_id, tmp_path):
    repo = new_repo(tmp_path / "shop")
    commit(repo, "Initial import", {"shop/app.py": APP_PY})
    source = make_source(tenant_id, repo)
    assert ingest(tenant_id, source).status == "succeeded"
    before = rows(tenant_id, source)

    source_update_config(tenant_id=tenant_id, source_id=source.pk, config={"path": str(tmp_path / "moved")})
    run = ingest(tenant_id, source)

    assert run.status == "failed"
    assert str(tmp_path / "moved") in run.error
    after = rows(tenant_id, source)
    assert {k: d.content_hash for k, d in after.items()} == {k: d.content_hash for k, d in before.items()}
    with tenant_context(tenant_id):
        assert DataSource.objects.get(pk=source.pk).generation == 1


# -- 5. include / exclude --------------------------------------------------------------------------


def test_include_and_exclude_globs_select_files(tenant_id, tmp_path):
    repo = new_repo(tmp_path / "shop")
    commit(
        repo,
        "Initial import",
        {
            "src/app.py": "def main():\n    return 0\n",
            "src/vendor/lib.py": "def vendored():\n    return 1\n",
            "docs/guide.md": "# Guide\n",
            "setup.cfg": "[metadata]\nname = shop\n",
        },
    )
    source = make_source(tenant_id, repo, include=["src/*", "*.cfg"], exclude=["*/vendor/*"])

    run = ingest(tenant_id, source)

    assert run.status == "succeeded", run.error
    files = rows(tenant_id, source, kind="code_file")
    assert set(files) == {"src/app.py", "setup.cfg"}
    assert set(rows(tenant_id, source, kind="code_chunk")) == {"src/app.py#main", "setup.cfg#L1"}


# -- 6. the chunker on its own ------------------------------------------------------------------------

TS_SOURCE = """import { api } from "./api";

/**
 * Fetches an order.
 * @param id the order id
 */
export async function fetchOrder(id: string): Promise<Order> {
  return api.get(`/orders/${id}`);
}

export const total = (order: Order) => order.lines.reduce((s, l) => s + l.price, 0);

interface Order {
  id: string;
  lines: Line[];
}

export class OrderStore {
  private cache = new Map<string, Order>();

  get(id: string): Order | undefined {
    return this.cache.get(id);
  }
}
"""


def test_chunker_splits_typescript_along_declarations():
    outline = chunk_file("web/orders.ts", TS_SOURCE)

    assert outline.language == "typescript"
    assert [(c.key, c.symbol_kind, c.start_line, c.end_line) for c in outline.chunks] == [
        ("<module>", "module", 1, 1),
        ("fetchOrder", "function", 3, 9),
        ("total", "function", 11, 11),
        ("Order", "type", 13, 16),
        ("OrderStore", "class", 18, 24),
    ]
    fetch = outline.chunks[1]
    assert fetch.signature == "export async function fetchOrder(id: string): Promise<Order>"
    assert fetch.docstring == "Fetches an order.\n@param id the order id"
    assert fetch.code == lines(TS_SOURCE, 3, 9)
    assert outline.top_level == [
        ("function", "fetchOrder"),
        ("function", "total"),
        ("type", "Order"),
        ("class", "OrderStore"),
    ]


def test_chunker_qualifies_go_methods_by_receiver():
    source = "package shop\n\n// Cart holds lines.\ntype Cart struct {\n\tLines []int\n}\n\n// Total sums.\nfunc (c *Cart) Total() int {\n\treturn 0\n}\n"  # noqa: E501

    outline = chunk_file("shop/cart.go", source)

    assert [(c.key, c.symbol_kind, c.start_line, c.end_line) for c in outline.chunks] == [
        ("<module>", "module", 1, 1),
        ("Cart", "type", 3, 6),
        ("Cart.Total", "method", 8, 11),
    ]
    method = outline.chunks[2]
    assert (method.signature, method.docstring) == ("func (c *Cart) Total() int", "Total sums.")
    assert method.enclosing_signature == "type Cart struct"


def test_chunker_splits_a_long_function_at_statement_boundaries():
    body = "".join(f"    value_{i} = compute({i})\n" for i in range(150))
    source = f'def build():\n    """Builds."""\n{body}    return value_0\n'

    outline = chunk_file("build.py", source)

    parts = outline.chunks
    assert [c.key for c in parts] == ["build:1", "build:2", "build:3"]
    assert [(c.start_line, c.end_line) for c in parts] == [(1, 60), (61, 120), (121, 153)]
    assert all(c.symbol == "build" and c.symbol_kind == "block" for c in parts)
    assert [c.part for c in parts] == [1, 2, 3]
    assert parts[2].code.endswith("    return value_0")


def test_chunker_cuts_text_without_grammar_into_windows_at_blank_lines():
    paragraphs = ["\n".join(f"Paragraph {p} line {i}." for i in range(9)) for p in range(15)]
    source = "\n\n".join(paragraphs) + "\n"  # 15 paragraphs of 9 lines, a blank line between

    outline = chunk_file("docs/notes.rst", source)

    spans = [(c.start_line, c.end_line) for c in outline.chunks]
    assert spans == [(1, 59), (61, 119), (121, 149)]  # each window ends on a paragraph's last line
    assert [c.key for c in outline.chunks] == ["L1", "L61", "L121"]
    assert all(c.symbol is None for c in outline.chunks)


def test_paths_longer_than_the_id_column_keep_their_rows_linked(tenant_id, tmp_path):
    repo = new_repo(tmp_path / "shop")
    deep = "/".join(["a" * 200, "b" * 200, "c" * 150]) + ".py"  # 555 characters
    commit(repo, "Deep file", {deep: "def leaf():\n    return 1\n"})
    source = make_source(tenant_id, repo)

    run = ingest(tenant_id, source)

    assert run.status == "succeeded", run.error
    docs = {d.kind: d for d in rows(tenant_id, source).values()}
    assert docs["code_file"].path == deep
    assert len(docs["code_file"].external_id) == len(docs["code_chunk"].external_id) == 512
    assert docs["code_chunk"].parent_id == docs["code_file"].pk
    assert docs["code_chunk"].title == f"{deep}: leaf"
