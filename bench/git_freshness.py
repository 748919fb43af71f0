"""How long a git source takes to take in a one-file commit, in a repository of many files.

Usage:

    .venv/bin/python bench/git_freshness.py [--files 10000] [--workdir DIR] [--keep]

Writes a repository of ``--files`` small Python modules (each a docstring and two functions,
spread over 100 packages) under ``--workdir`` (default: a new temp folder, removed afterwards
unless ``--keep``), and indexes it as the git data source ``bench-git`` of the tenant
``bench-freshness`` in the configured database (the embedded server by default; the source is
replaced on every run), through ``sources.services.source_ingest``, the service a Celery worker
runs. Then, one at a time: a run with nothing new, a commit changing one file, a commit adding
one and deleting another, and the same one-file change read with ``incremental: false`` (every
file read and parsed again; unchanged rows still cost no write and no embedding). Prints one
table: step, seconds, rows seen, created, updated, deleted, embedded.
"""

from __future__ import annotations

import argparse
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

TENANT = "bench-freshness"
SLUG = "bench-git"
GIT_ENV = {
    **os.environ,
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "Bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "Bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
}


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], env=GIT_ENV, check=True, capture_output=True)


def _module(i: int, variant: str = "") -> str:
    return (
        f'"""Module {i}: helpers for ledger {i}{variant}."""\n\n\n'
        f"def total_{i}(items):\n"
        f'    """Sum the amounts of ledger {i}."""\n'
        f"    return sum(item.amount for item in items)\n\n\n"
        f"def label_{i}(name):\n"
        f'    return f"ledger-{i}:{{name}}"\n'
    )


def build(repo: Path, files: int) -> None:
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    for i in range(files):
        path = repo / f"pkg{i % 100:02d}" / f"mod{i:05d}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(_module(i))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"{files} modules")


def run(files: int, workdir: Path) -> None:
    import django

    django.setup()
    from django.core.management import call_command

    from kbportal.tenancy import tenant_context
    from projects.services import tenant_onboard
    from sources.models import DataSource
    from sources.services import source_create, source_ingest, source_update_config

    call_command("migrate", verbosity=0)
    onboarded = tenant_onboard(
        name="Bench freshness",
        slug=TENANT,
        admin_username="bench-freshness-admin",
        admin_password=os.urandom(12).hex(),
    )
    tenant_id = onboarded.tenant.pk
    with tenant_context(tenant_id):
        DataSource.objects.filter(slug=SLUG).delete()
    repo = workdir / "repo"
    t0 = time.perf_counter()
    build(repo, files)
    print(f"repository of {files} files written in {time.perf_counter() - t0:.1f}s", flush=True)
    source = source_create(tenant_id=tenant_id, kind="git", name="Bench git", slug=SLUG, config={"path": str(repo)})

    results = []

    def step(name: str) -> None:
        started = time.perf_counter()
        run = source_ingest(tenant_id=tenant_id, source_id=source.pk)
        seconds = time.perf_counter() - started
        if run.status not in ("succeeded", "partial"):
            raise SystemExit(f"{name}: the run {run.status}: {run.error}")
        results.append((name, seconds, run))
        print(f"{name}: {seconds:.2f}s", flush=True)

    step("first run (everything)")
    step("no new commit")
    (repo / "pkg07" / "mod00007.py").write_text(_module(7, " (revised)"))
    _git(repo, "commit", "-qam", "Revise module 7")
    step("one file changed")
    (repo / "pkg07" / "extra.py").write_text(_module(files + 1))
    (repo / "pkg08" / "mod00008.py").unlink()
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "Add one module, delete another")
    step("one added, one deleted")
    (repo / "pkg07" / "mod00007.py").write_text(_module(7, " (revised twice)"))
    _git(repo, "commit", "-qam", "Revise module 7 again")
    source_update_config(tenant_id=tenant_id, source_id=source.pk, config={"path": str(repo), "incremental": False})
    step("one file changed, incremental: false")

    print()
    print(f"{'step':<38} {'seconds':>8} {'seen':>7} {'created':>8} {'updated':>8} {'deleted':>8} {'embedded':>9}")
    for name, seconds, r in results:
        print(f"{name:<38} {seconds:>8.2f} {r.seen:>7} {r.created:>8} {r.updated:>8} {r.deleted:>8} {r.embedded:>9}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--files", type=int, default=10_000, help="files in the repository")
    parser.add_argument("--workdir", type=Path, help="where the repository is written (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the repository afterwards")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kbportal-git-freshness-"))
    if (workdir / "repo").exists():
        raise SystemExit(f"{workdir / 'repo'} exists; give a new or empty --workdir")
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        run(args.files, workdir)
    finally:
        if not args.keep:
            shutil.rmtree(workdir / "repo", ignore_errors=True)
            if args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
