"""Peak memory of an ingestion worker fed oversized files: every file-reading connector bounded.

Usage:

    .venv/bin/python bench/ingest_memory.py [--big-mb 300] [--lines 2000000] [--workdir DIR] [--keep]

Writes, under ``--workdir`` (a new or empty folder; default: a new folder in the system temp
dir; what it writes is removed afterwards unless ``--keep``), the inputs of four scenarios,
each next to the same small set of ordinary items so that their rows (and so the embedding
work) are alike:

- ``docs``: 40 Markdown pages (the baseline);
- ``docs+big``: the same pages plus a ``--big-mb`` MB log file (``server.log.txt``) and a
  ``--lines``-line Markdown file (``changelog.md``, one short entry per line);
- ``jsonl+big``: 40 JSONL records plus a JSONL file that is one ``--big-mb`` MB record on one
  line, and a ``--big-mb`` MB ``.json`` file;
- ``slack+big``: a Slack export of 40 days of one channel plus a ``--big-mb`` MB day file.

The inputs are written 1 MiB at a time. Each scenario is one data source of the tenant
``bench-memory`` in the configured database (the embedded server by default; its rows are
replaced on every run), ingested with the connectors' default limits by ``manage.py ingest`` in
a child process, the same service a Celery worker runs. The child's peak resident set size is
read from ``os.wait4`` (``ru_maxrss``, KiB on Linux). Prints one table: scenario, input MB,
rows, skipped items (with their reasons), seconds, peak RSS MB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kbportal.settings")

TENANT = "bench-memory"
ITEMS = 40
PIECE = 1 << 20

WORDS = (
    "deploy queue worker cache index retry backoff schema migration token session audit channel "
    "release rollback latency replica shard vector embedding chunk thread burst citation"
).split()


def _sentence(i: int, n: int = 30) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n)) + "."


def _write_big(path: Path, megabytes: int, *, prefix: bytes = b"", suffix: bytes = b"", fill: bytes) -> None:
    """``megabytes`` MiB of ``fill`` between ``prefix`` and ``suffix``, written a piece at a time."""
    piece = (fill * (PIECE // len(fill) + 1))[:PIECE]
    with path.open("wb") as out:
        out.write(prefix)
        for _ in range(megabytes):
            out.write(piece)
        out.write(suffix)


def _pages(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(ITEMS):
        body = "\n\n".join(f"## Part {k}\n\n{_sentence(i + k)}" for k in range(3))
        (folder / f"page-{i:02d}.md").write_text(f"# Page {i}\n\n{_sentence(i)}\n\n{body}\n")


def build(workdir: Path, big_mb: int, lines: int) -> dict[str, tuple[str, dict]]:
    """Write the inputs; returns scenario -> (connector kind, config)."""
    docs = workdir / "docs"
    _pages(docs)
    docs_big = workdir / "docs-big"
    _pages(docs_big)
    _write_big(docs_big / "server.log.txt", big_mb, fill=b"2026-12-02T12:00:00Z INFO worker heartbeat ok\n")
    with (docs_big / "changelog.md").open("w") as out:
        for i in range(lines):
            out.write(f"- entry {i}: fixed a thing\n")
    records = workdir / "records"
    records.mkdir(parents=True, exist_ok=True)
    with (records / "records.jsonl").open("w") as out:
        for i in range(ITEMS):
            out.write(json.dumps({"id": f"r{i}", "title": f"Record {i}", "content": _sentence(i, 60)}) + "\n")
    _write_big(records / "one-line.jsonl", big_mb, prefix=b'{"id": "huge", "content": "', suffix=b'"}\n', fill=b"z")
    _write_big(records / "dump.json", big_mb, prefix=b'[{"id": "dump", "content": "', suffix=b'"}]', fill=b"y")
    export = workdir / "slack"
    (export / "general").mkdir(parents=True, exist_ok=True)
    (export / "channels.json").write_text(json.dumps([{"id": "C1", "name": "general"}]))
    (export / "users.json").write_text(json.dumps([{"id": "U1", "name": "ana"}, {"id": "U2", "name": "lee"}]))
    for day in range(ITEMS):
        ts = 1_760_000_000 + day * 86_400
        messages = [
            {"type": "message", "user": "U1", "ts": f"{ts}.000100", "text": _sentence(day)},
            {"type": "message", "user": "U2", "ts": f"{ts + 60}.000100", "text": _sentence(day + 1)},
        ]
        stamp = time.strftime("%Y-%m-%d", time.gmtime(ts))
        (export / "general" / f"{stamp}.json").write_text(json.dumps(messages))
    _write_big(
        export / "general" / "2030-01-01.json",
        big_mb,
        prefix=b'[{"type": "message", "user": "U1", "ts": "1893456000.000100", "text": "',
        suffix=b'"}]',
        fill=b"w",
    )
    return {
        "docs": ("docs", {"path": str(docs)}),
        "docs+big": ("docs", {"path": str(docs_big)}),
        "jsonl+big": ("jsonl", {"path": str(records)}),
        "slack+big": ("slack_export", {"path": str(export)}),
    }


def _folder_mb(config: dict) -> float:
    root = Path(config["path"])
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) / 1e6


def run(big_mb: int, lines: int, workdir: Path) -> None:
    import django

    django.setup()
    from django.core.management import call_command

    from kbportal.tenancy import tenant_context
    from projects.services import tenant_onboard
    from sources.models import DataSource, IngestionRun
    from sources.services import source_create

    call_command("migrate", verbosity=0)
    onboarded = tenant_onboard(
        name="Bench memory", slug=TENANT, admin_username="bench-memory-admin", admin_password=os.urandom(12).hex()
    )
    tenant_id = onboarded.tenant.pk
    with tenant_context(tenant_id):
        DataSource.objects.filter(slug__startswith="mem-").delete()
    t0 = time.perf_counter()
    scenarios = build(workdir, big_mb, lines)
    print(f"inputs written to {workdir} in {time.perf_counter() - t0:.1f}s", flush=True)

    results = []
    for name, (kind, config) in scenarios.items():
        slug = "mem-" + name.replace("+", "-")
        source = source_create(tenant_id=tenant_id, kind=kind, name=f"Memory {name}", slug=slug, config=config)
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "manage.py", "ingest", f"{TENANT}/{slug}", "--quiet"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            err = child.stderr.read().decode(errors="replace") if child.stderr else ""
            raise SystemExit(f"ingesting {name} failed ({child.returncode}):\n{err[-2000:]}")
        with tenant_context(tenant_id):
            last = IngestionRun.objects.filter(source_id=source.pk).order_by("-id").first()
        assert last is not None
        results.append((name, _folder_mb(config), last, seconds, usage.ru_maxrss / 1024))

    print()
    print(
        f"{'scenario':<10} {'input MB':>9} {'status':>9} {'rows':>5} {'skipped':>7} {'seconds':>7} {'peak RSS MB':>11}"
    )
    for name, size, last, seconds, rss in results:
        print(f"{name:<10} {size:>9.2f} {last.status:>9} {last.seen:>5} {last.skipped:>7} {seconds:>7.1f} {rss:>11.0f}")
    print()
    for name, _, last, _, _ in results:
        for item in last.skipped_items:
            print(f"  {name}: skipped {item['item']}: {item['reason']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--big-mb", type=int, default=300, help="size of each oversized file (MiB)")
    parser.add_argument("--lines", type=int, default=2_000_000, help="lines of the many-line Markdown file")
    parser.add_argument("--workdir", type=Path, help="where the inputs are written (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the inputs afterwards")
    args = parser.parse_args()
    if args.workdir is not None and args.workdir.exists() and any(args.workdir.iterdir()):
        raise SystemExit(f"--workdir {args.workdir} is not empty; give a new or empty folder")
    created = args.workdir is None or not args.workdir.exists()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kbportal-memory-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        run(args.big_mb, args.lines, workdir)
    finally:
        if not args.keep:
            # Only what this run wrote: the folder it created, or the inputs inside the given one.
            if created:
                shutil.rmtree(workdir, ignore_errors=True)
            else:
                for name in ("docs", "docs-big", "records", "slack"):
                    shutil.rmtree(workdir / name, ignore_errors=True)


if __name__ == "__main__":
    main()
