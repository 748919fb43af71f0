"""The docs folder connector, end to end through ``source_ingest`` on real PostgreSQL.

The FastAPI docs (155 real Markdown pages) check page/section rows, line ranges against the
files themselves, neighbours, parent links and idempotent re-runs; small pages written to
``tmp_path`` cover edits, deletions, HTML, reST, fences, splitting and broken input.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from kbportal.tenancy import tenant_context
from sources.connectors.base import IngestReport
from sources.connectors.docs.connector import DocsConnector
from sources.models import DataSource, Document, IngestionRun, TermStat
from sources.services import source_create, source_ingest, source_refresh_term_stats, source_update_config

ROW_FIELDS = (
    "id",
    "external_id",
    "kind",
    "title",
    "content",
    "text",
    "url",
    "path",
    "start_line",
    "end_line",
    "position",
    "parent_external_id",
    "parent_id",
    "metadata",
    "updated_at",
    "indexed_at",
)


def _docs(shared_dir: Path) -> Path:
    return shared_dir / "corpora" / "fastapi-docs" / "docs" / "en" / "docs"


def _ingest(
    tenant_id: int, config: dict[str, Any], include: list[str] | None = None, name: str = "Docs"
) -> tuple[int, IngestionRun]:
    source = source_create(tenant_id=tenant_id, kind="docs", name=name, config=config, include=include)
    return source.pk, source_ingest(tenant_id=tenant_id, source_id=source.pk)


def _rows(tenant_id: int, source_id: int) -> dict[str, dict[str, Any]]:
    with tenant_context(tenant_id):
        return {
            d["external_id"]: d
            for d in Document.objects.filter(source_id=source_id).values(*ROW_FIELDS).order_by("path", "position")
        }


def _connector_rows(folder: Path, **config: Any) -> list:
    report = IngestReport()
    rows = list(DocsConnector({"path": str(folder), **config}).iter_rows(report))
    assert report.skipped == []
    return rows


@pytest.fixture
def tenant_id(make_tenant) -> int:
    return make_tenant("acme").tenant.pk


@pytest.mark.slow
def test_full_fastapi_docs_folder_ingests_every_page_and_reruns_for_free(tenant_id, shared_dir):
    folder = _docs(shared_dir)
    pages = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.md"))
    assert len(pages) == 155

    started = time.monotonic()
    source_id, run = _ingest(tenant_id, {"path": str(folder), "url_base": "https://fastapi.tiangolo.com"})
    seconds = time.monotonic() - started
    rows = _rows(tenant_id, source_id)
    print(f"\nfastapi docs: {len(rows)} rows, {run.embedded} embedded in {seconds:.1f} s")

    assert run.status == IngestionRun.Status.SUCCEEDED, run.error
    page_rows = {r["external_id"]: r for r in rows.values() if r["kind"] == "doc_page"}
    sections = [r for r in rows.values() if r["kind"] == "doc_section"]
    assert sorted(page_rows) == pages
    assert run.seen == run.created == run.embedded == len(rows) == len(page_rows) + len(sections)
    # Every page has at least one section, and every section points at its page row.
    assert {s["path"] for s in sections} == set(pages)
    assert all(s["parent_id"] == page_rows[s["path"]]["id"] for s in sections)
    assert all(page_rows[p]["metadata"]["sections"] == sum(s["path"] == p for s in sections) for p in pages)
    # Section text never exceeds the split limit by more than a glued heading line.
    assert max(len(s["content"]) for s in sections) < 4000 + 200

    # The 700 KB release notes page is stored whole up to the service's cap and split finely.
    notes = page_rows["release-notes.md"]
    assert notes["title"] == "Release Notes"
    assert notes["metadata"]["truncated"] is True and len(notes["content"]) == 400_000
    assert notes["metadata"]["sections"] > 500
    fixes = rows["release-notes.md#release-notes/01411-2026-07-29/fixes"]
    assert fixes["title"] == "Release Notes > 0.141.1 (2026-07-29) > Fixes"
    # "## 0.141.1" has no body of its own, so it was merged into the "### Fixes" under it.
    assert fixes["metadata"]["merged_headings"] == ["0.141.1 (2026-07-29)"]
    lines = (folder / "release-notes.md").read_text().split("\n")
    assert lines[fixes["start_line"] - 1] == "## 0.141.1 (2026-07-29)"
    assert fixes["content"] == "\n".join(lines[fixes["start_line"] - 1 : fixes["end_line"]])

    again = source_ingest(tenant_id=tenant_id, source_id=source_id)
    assert again.status == IngestionRun.Status.SUCCEEDED
    assert (again.embedded, again.created, again.updated, again.deleted) == (0, 0, 0, 0)
    assert again.unchanged == again.seen == len(rows)

    # Search finds the right page for questions that describe it in other words.
    from search.retrieval import hybrid_search
    from sources.selectors import QueryScope

    scope = QueryScope(tenant_id, None, 0, "docs", "Docs", (source_id,))
    for question, page in [
        ("Can I serve an existing Flask application from inside my FastAPI app?", "advanced/wsgi.md"),
        ("How do I push live updates to a browser with server-sent events?", "tutorial/server-sent-events.md"),
        (
            "In tests, how do I replace a dependency that calls an external service with a fake one?",
            "advanced/testing-dependencies.md",
        ),
    ]:
        top = [h.path for h in hybrid_search(question, scope, limit=3).hits]
        assert page in top, (question, top)


def test_cookie_params_sections_match_the_file(tenant_id, shared_dir):
    folder = _docs(shared_dir)
    source_id, run = _ingest(
        tenant_id,
        {"path": str(folder), "url_base": "https://fastapi.tiangolo.com/"},
        include=["tutorial/cookie-params.md", "tutorial/header-params.md"],
    )
    assert run.status == IngestionRun.Status.SUCCEEDED, run.error
    rows = _rows(tenant_id, source_id)
    assert {r["path"] for r in rows.values()} == {"tutorial/cookie-params.md", "tutorial/header-params.md"}

    page = rows["tutorial/cookie-params.md"]
    assert page["kind"] == "doc_page"
    assert page["title"] == "Cookie Parameters"
    assert page["url"] == "https://fastapi.tiangolo.com/tutorial/cookie-params.md"
    # Embedded page text: the title, then the body from the top (headings left out), ~1000 chars.
    assert page["text"].startswith(
        "Cookie Parameters\n\nYou can define Cookie parameters the same way you define `Query` and `Path` parameters."
        "\n\nFirst import `Cookie`:"
    )
    assert 990 <= len(page["text"]) <= 1000
    source_text = (folder / "tutorial/cookie-params.md").read_text()
    assert page["content"] == source_text.strip("\n")

    sections = [r for r in rows.values() if r["kind"] == "doc_section" and r["path"] == "tutorial/cookie-params.md"]
    prefix = "tutorial/cookie-params.md#cookie-parameters"
    assert [s["external_id"] for s in sections] == [
        prefix,
        f"{prefix}/import-cookie",
        f"{prefix}/declare-cookie-parameters",
        f"{prefix}/recap",
    ]
    assert [s["title"] for s in sections] == [
        "Cookie Parameters",
        "Cookie Parameters > Import Cookie",
        "Cookie Parameters > Declare Cookie parameters",
        "Cookie Parameters > Recap",
    ]
    lines = source_text.split("\n")
    assert [(s["start_line"], s["end_line"]) for s in sections] == [(1, 3), (5, 9), (11, 41), (43, 45)]
    for s in sections:
        assert s["content"] == "\n".join(lines[s["start_line"] - 1 : s["end_line"]])
        assert s["parent_external_id"] == "tutorial/cookie-params.md"
        assert s["parent_id"] == page["id"]
    assert lines[4] == "## Import `Cookie` { #import-cookie }"
    assert [s["position"] for s in sections] == [0, 1, 2, 3]
    assert [s["url"] for s in sections] == [
        "https://fastapi.tiangolo.com/tutorial/cookie-params.md#cookie-parameters",
        "https://fastapi.tiangolo.com/tutorial/cookie-params.md#import-cookie",
        "https://fastapi.tiangolo.com/tutorial/cookie-params.md#declare-cookie-parameters",
        "https://fastapi.tiangolo.com/tutorial/cookie-params.md#recap",
    ]
    declare = sections[2]
    assert declare["metadata"] == {
        "heading_path": ["Cookie Parameters", "Declare Cookie parameters"],
        "level": 2,
        "anchor": "declare-cookie-parameters",
        "page_title": "Cookie Parameters",
        "prev_section": f"{prefix}/import-cookie",
        "next_section": f"{prefix}/recap",
    }
    assert sections[0]["metadata"]["prev_section"] is None
    assert sections[-1]["metadata"]["next_section"] is None
    # The MkDocs include and the admonitions are kept as text; the embedded text leads with the path.
    assert "{* ../../docs_src/cookie_params/tutorial001_an_py310.py hl[9] *}" in declare["content"]
    assert declare["text"].startswith("Cookie Parameters > Declare Cookie parameters\n\nThen declare the cookie")
    assert "## Declare" not in declare["text"]

    # Progress is reported in files: both pages, in order, whatever their row counts; a run
    # that keeps both pages unread reports them done.
    calls: list[tuple[int, int | None]] = []
    again = source_ingest(
        tenant_id=tenant_id, source_id=source_id, progress=lambda done, total: calls.append((done, total))
    )
    assert again.embedded == 0 and again.unchanged == len(rows) and calls == [(2, 2)]
    with tenant_context(tenant_id):
        config = DataSource.objects.get(pk=source_id).config
    source_update_config(tenant_id=tenant_id, source_id=source_id, config={**config, "incremental": False})
    calls.clear()
    again = source_ingest(
        tenant_id=tenant_id, source_id=source_id, progress=lambda done, total: calls.append((done, total))
    )
    assert again.embedded == 0 and again.unchanged == len(rows)
    assert len(calls) == len(rows) + 1  # one per row, and the end
    assert sorted(set(calls)) == [(1, 2), (2, 2)]


def _copy_pages(shared_dir: Path, target: Path, names: list[str]) -> Path:
    for name in names:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_docs(shared_dir) / name, target / name)
    return target


@pytest.mark.slow
def test_edited_page_changes_only_its_rows_and_deleted_page_vanishes(tenant_id, shared_dir, tmp_path):
    names = ["tutorial/cookie-params.md", "tutorial/header-params.md", "tutorial/body.md"]
    folder = _copy_pages(shared_dir, tmp_path / "docs", names)
    source_id, first = _ingest(tenant_id, {"path": str(folder)})
    assert first.status == IngestionRun.Status.SUCCEEDED, first.error
    before = _rows(tenant_id, source_id)
    per_page = {n: [e for e, r in before.items() if r["path"] == n] for n in names}

    page = folder / "tutorial/cookie-params.md"
    page.write_text(page.read_text().replace("using the same common pattern", "with the very same pattern"))
    # A later mtime, even on a coarse-grained file system.
    stat = page.stat()
    os.utime(page, (stat.st_atime, stat.st_mtime + 10))
    second = source_ingest(tenant_id=tenant_id, source_id=source_id)
    after = _rows(tenant_id, source_id)

    assert second.status == IngestionRun.Status.SUCCEEDED
    # The page and its sections get the new mtime; only the edited Recap section is re-embedded
    # (the page row's embedded text is its opening, which did not change).
    assert second.updated == len(per_page["tutorial/cookie-params.md"])
    assert second.embedded == 1
    assert second.unchanged == len(before) - second.updated
    recap = after["tutorial/cookie-params.md#cookie-parameters/recap"]
    assert "with the very same pattern" in recap["content"] and "with the very same pattern" in recap["text"]
    for name in ("tutorial/header-params.md", "tutorial/body.md"):
        for external_id in per_page[name]:
            assert after[external_id]["indexed_at"] == before[external_id]["indexed_at"]
            assert after[external_id]["id"] == before[external_id]["id"]

    (folder / "tutorial/header-params.md").unlink()
    third = source_ingest(tenant_id=tenant_id, source_id=source_id)
    remaining = _rows(tenant_id, source_id)
    assert third.deleted == len(per_page["tutorial/header-params.md"])
    assert not any(r["path"] == "tutorial/header-params.md" for r in remaining.values())
    assert set(remaining) == set(per_page["tutorial/cookie-params.md"]) | set(per_page["tutorial/body.md"])


def test_an_incremental_run_parses_only_the_files_whose_bytes_changed(tenant_id, tmp_path):
    folder = tmp_path / "docs"
    pages = {
        "deploy.md": "# Deploying\n\nRun the release job from the main branch.\n",
        "oncall.md": "# On call\n\nThe rota changes on Mondays at 10:00.\n",
        "backups.md": "# Backups\n\nNightly snapshots are kept for 35 days.\n",
    }
    folder.mkdir()
    for name, text in pages.items():
        (folder / name).write_text(text)
    source_id, first = _ingest(tenant_id, {"path": str(folder)})
    assert first.status == IngestionRun.Status.SUCCEEDED, first.error
    before = _rows(tenant_id, source_id)

    (folder / "oncall.md").write_text(pages["oncall.md"].replace("Mondays", "Tuesdays"))
    (folder / "backups.md").unlink()
    (folder / "status.md").write_text("# Status page\n\nIncidents are posted at status.example.\n")
    touched = folder / "deploy.md"  # a newer mtime, the same bytes: still unchanged
    os.utime(touched, (touched.stat().st_atime, touched.stat().st_mtime + 10))

    connector = DocsConnector({"path": str(folder)})
    connector.bind_source(tenant_id=tenant_id, source_id=source_id)
    report = IngestReport()
    yielded = {row.path for row in connector.iter_rows(report)}
    assert yielded == {"oncall.md", "status.md"} and report.kept == {"deploy.md"}

    second = source_ingest(tenant_id=tenant_id, source_id=source_id)
    after = _rows(tenant_id, source_id)
    assert second.status == IngestionRun.Status.SUCCEEDED
    assert not any(r["path"] == "backups.md" for r in after.values())
    deploy = [e for e, r in before.items() if r["path"] == "deploy.md"]
    assert deploy and all(after[e]["id"] == before[e]["id"] for e in deploy)
    assert any("Tuesdays" in r["content"] for r in after.values() if r["path"] == "oncall.md")
    assert second.seen == len(after)
    # A small run kept the term statistics and the row count current as it wrote: a recount
    # from every row finds the same.
    with tenant_context(tenant_id):
        kept_counts = dict(TermStat.objects.filter(source_id=source_id).values_list("lexeme", "ndoc"))
        kept_rows = DataSource.objects.get(pk=source_id).indexed_rows
        source_refresh_term_stats(source_id)
        assert dict(TermStat.objects.filter(source_id=source_id).values_list("lexeme", "ndoc")) == kept_counts
        assert DataSource.objects.get(pk=source_id).indexed_rows == kept_rows == len(after)
    assert "tuesday" in kept_counts and "snapshot" not in kept_counts

    # Other section settings make other rows: every page is parsed again.
    connector = DocsConnector({"path": str(folder), "max_section_chars": 500})
    connector.bind_source(tenant_id=tenant_id, source_id=source_id)
    report = IngestReport()
    assert {row.path for row in connector.iter_rows(report)} == {"deploy.md", "oncall.md", "status.md"}
    assert report.kept == set()


def test_missing_folder_fails_naming_it_and_keeps_earlier_rows(tenant_id, shared_dir, tmp_path):
    folder = _copy_pages(shared_dir, tmp_path / "docs", ["tutorial/cookie-params.md"])
    source_id, first = _ingest(tenant_id, {"path": str(folder)})
    kept = len(_rows(tenant_id, source_id))
    assert first.status == IngestionRun.Status.SUCCEEDED and kept == 5

    folder.rename(tmp_path / "moved")
    failed = source_ingest(tenant_id=tenant_id, source_id=source_id)
    assert failed.status == IngestionRun.Status.FAILED
    assert failed.error == f"docs folder {folder} does not exist"
    assert len(_rows(tenant_id, source_id)) == kept

    not_a_folder = tmp_path / "moved" / "tutorial" / "cookie-params.md"
    _, run = _ingest(tenant_id, {"path": str(not_a_folder)}, name="A file")
    assert run.status == IngestionRun.Status.FAILED
    assert str(not_a_folder) in run.error and "not a folder" in run.error


def test_binary_and_latin1_pages_are_skipped_and_recorded(tenant_id, tmp_path):
    (tmp_path / "good.md").write_text("# Good page\n\nThis page is fine and has enough words to stand alone.\n")
    (tmp_path / "image.md").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    (tmp_path / "legacy.md").write_bytes("# Café menu\n\nCrème brûlée for everyone.\n".encode("latin-1"))
    source_id, run = _ingest(tenant_id, {"path": str(tmp_path)})

    assert run.status == IngestionRun.Status.PARTIAL
    assert run.skipped == 2
    assert run.skipped_items == [
        {"item": "image.md", "reason": "binary file (contains NUL bytes)"},
        {"item": "legacy.md", "reason": "not UTF-8 text: invalid byte 0xe9 at offset 5"},
    ]
    rows = _rows(tenant_id, source_id)
    assert sorted(rows) == ["good.md", "good.md#good-page"]
    assert rows["good.md#good-page"]["content"] == (
        "# Good page\n\nThis page is fine and has enough words to stand alone."
    )


def test_empty_folder_yields_no_rows(tenant_id, tmp_path):
    (tmp_path / "notes.pdf").write_bytes(b"%PDF-1.4")
    source_id, run = _ingest(tenant_id, {"path": str(tmp_path)})
    assert run.status == IngestionRun.Status.SUCCEEDED
    assert (run.seen, run.skipped) == (0, 0)
    assert _rows(tenant_id, source_id) == {}


HTML_PAGE = """<!DOCTYPE html>
<html>
<head><title>Deploy guide - Acme</title><style>h2 { color: red; }</style></head>
<body>
<h1>Deploying Acme</h1>
<p>How to ship the <b>Acme</b> service to production, step by step.</p>
<h2 id="build">Build the image</h2>
<p>Run the build with the cache enabled.</p>
<pre><code>docker build -t acme .
docker push acme</code></pre>
<script>var h2 = "<h2>not a heading</h2>";</script>
<h2>Roll out</h2>
<ul><li>Drain the old pods.</li><li>Watch the error rate.</li></ul>
</body>
</html>
"""


def test_html_page_is_split_by_headings_with_text_extracted(tmp_path):
    (tmp_path / "deploy.html").write_text(HTML_PAGE)
    rows = _connector_rows(tmp_path, url_base="https://docs.acme.test")
    page, *sections = rows
    assert (page.kind, page.title, page.metadata["format"]) == ("doc_page", "Deploying Acme", "html")
    assert "<p>" not in page.content and "not a heading" not in page.content and "color: red" not in page.content
    assert [s.title for s in sections] == [
        "Deploying Acme",
        "Deploying Acme > Build the image",
        "Deploying Acme > Roll out",
    ]
    assert [s.url for s in sections] == [
        "https://docs.acme.test/deploy.html#deploying-acme",
        "https://docs.acme.test/deploy.html#build",
        "https://docs.acme.test/deploy.html#roll-out",
    ]
    assert [(s.start_line, s.end_line) for s in sections] == [(5, 6), (7, 11), (12, 15)]
    assert sections[0].content == "Deploying Acme\n\nHow to ship the Acme service to production, step by step."
    # The code block keeps its line breaks; the script is gone.
    assert sections[1].content == (
        "Build the image\n\nRun the build with the cache enabled.\n\ndocker build -t acme .\ndocker push acme"
    )
    assert sections[2].content == "Roll out\n\nDrain the old pods.\n\nWatch the error rate."


def test_fenced_code_with_hash_lines_is_not_split(tmp_path):
    (tmp_path / "guide.md").write_text(
        "# Guide\n"
        "\n"
        "Start here with a long enough introduction paragraph.\n"
        "\n"
        "## Configure\n"
        "\n"
        "```bash\n"
        "# not a heading\n"
        "export KB_MODE=fast\n"
        "```\n"
        "\n"
        "~~~\n"
        "## also not a heading\n"
        "~~~\n"
        "\n"
        "    # indented code, not a heading either\n"
        "\n"
        "Setext heading\n"
        "--------------\n"
        "\n"
        "Text under the setext heading, long enough to stand alone.\n"
    )
    page, *sections = _connector_rows(tmp_path)
    assert [s.title for s in sections] == ["Guide", "Guide > Configure", "Guide > Setext heading"]
    configure = sections[1]
    assert (configure.start_line, configure.end_line) == (5, 16)
    assert "# not a heading\nexport KB_MODE=fast" in configure.content
    assert "## also not a heading" in configure.content
    assert (sections[2].start_line, sections[2].end_line) == (18, 21)


def test_front_matter_repeats_small_sections_and_long_sections(tmp_path):
    paragraph = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor. " * 3
    body = "\n\n".join(f"{i}. {paragraph}" for i in range(1, 9))
    (tmp_path / "faq.md").write_text(
        "---\ntitle: Frequently asked\ntags: [a, b]\n---\n\n"
        "Intro before any heading, long enough to be a section of its own.\n\n"
        "## Errors\n\n### Timeouts\n\nRaise the timeout when the upstream is slow to answer.\n\n"
        "## Setup\n\nA first section named Setup, with a long enough body.\n\n"
        "## Setup\n\nA second section with the same name, and a long enough body.\n\n"
        f"## Long one\n\n{body}\n"
    )
    page, *sections = _connector_rows(tmp_path, max_section_chars=700)
    # No H1: the front matter's title names the page; the front matter is not content.
    assert page.title == "Frequently asked"
    assert not page.content.startswith("---") and "tags:" not in page.content
    ids = [s.external_id for s in sections]
    assert ids[:4] == [
        "faq.md#frequently-asked",
        "faq.md#frequently-asked/errors/timeouts",
        "faq.md#frequently-asked/setup",
        "faq.md#frequently-asked/setup-2",
    ]
    # The empty "## Errors" was merged into the "### Timeouts" nested under it.
    timeouts = sections[1]
    assert timeouts.title == "Frequently asked > Errors > Timeouts"
    assert timeouts.metadata["merged_headings"] == ["Errors"]
    assert timeouts.content.startswith("## Errors\n\n### Timeouts\n")
    assert (timeouts.start_line, timeouts.end_line) == (8, 12)
    # The long section is split between list items into parts, none over the limit.
    long_parts = sections[4:]
    assert [s.external_id for s in long_parts] == [
        "faq.md#frequently-asked/long-one",
        "faq.md#frequently-asked/long-one-part2",
        "faq.md#frequently-asked/long-one-part3",
        "faq.md#frequently-asked/long-one-part4",
    ]
    assert all(len(s.content) <= 700 for s in long_parts)
    assert [s.metadata["part"] for s in long_parts] == [1, 2, 3, 4]
    assert "\n".join(s.content for s in long_parts).count("Lorem ipsum") == 8 * 3
    assert long_parts[1].start_line == long_parts[0].end_line + 2
    assert long_parts[1].metadata["prev_section"] == long_parts[0].external_id
    assert {s.title for s in long_parts} == {"Frequently asked > Long one"}


def test_rst_and_plain_text_pages(tmp_path):
    (tmp_path / "install.rst").write_text(
        "=======\nInstall\n=======\n\nGet the package from the index, then configure it.\n\n"
        "From source\n-----------\n\nClone the repository and run the build script.\n\n"
        "Checking\n~~~~~~~~\n\nRun the self test to make sure everything works.\n"
    )
    (tmp_path / "notes.txt").write_text("Plain notes without any heading.\n\nA second paragraph.\n")
    rows = _connector_rows(tmp_path)
    by_id = {r.external_id: r for r in rows}
    assert by_id["install.rst"].title == "Install"
    assert [r.title for r in rows if r.path == "install.rst" and r.kind == "doc_section"] == [
        "Install",
        "Install > From source",
        "Install > From source > Checking",
    ]
    from_source = by_id["install.rst#install/from-source"]
    assert (from_source.start_line, from_source.end_line) == (7, 10)
    assert from_source.content == "From source\n-----------\n\nClone the repository and run the build script."
    notes = by_id["notes.txt#notes"]
    assert (notes.title, notes.start_line, notes.end_line) == ("notes", 1, 3)
    assert notes.content == "Plain notes without any heading.\n\nA second paragraph."


def test_glob_patterns_and_hidden_folders(tmp_path):
    (tmp_path / "a.md").write_text("# A\n\nTop-level page with a body long enough to matter.\n")
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "deep" / "er" / "b.md").write_text("# B\n\nNested page with a body long enough to matter.\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "c.md").write_text("# C\n\nInside a hidden folder.\n")
    report = IngestReport()
    pages = [r.external_id for r in DocsConnector({"path": str(tmp_path)}).iter_rows(report) if r.kind == "doc_page"]
    assert pages == ["a.md", "deep/er/b.md"]
    assert report.total == report.done == 2
    only_top = DocsConnector({"path": str(tmp_path), "glob": ["*.md"]}).list_files(tmp_path)
    assert only_top == ["a.md"]
    excluded = DocsConnector({"path": str(tmp_path)}, exclude=["deep/*"]).list_files(tmp_path)
    assert excluded == ["a.md"]
    assert all(re.fullmatch(r"[a-z/.]+", p) for p in pages)
