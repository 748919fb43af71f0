"""``manage.py demo``: the one-command portal on real data (what ``make demo`` runs).

Migrates, creates a demo tenant, an admin user (credentials printed) and a project, registers
real data sources (the FastAPI 0.141.1 source from its PyPI sdist, this repository's code,
docs and history, plus ``--slack-export PATH`` and ``--docs PATH``), starts a Celery worker,
Celery beat (scheduled syncs) and the web server, ingests every source through Celery, answers
two sample questions in the terminal, then keeps serving until Ctrl-C (``--no-serve`` stops
after the questions).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from kbportal.tenancy import tenant_context
from projects.services import tenant_onboard
from search.evaluation import fastapi_source_checkout
from search.rendering import answer_terminal_text
from search.services import ask
from sources.models import DataSource, IngestionRun
from sources.selectors import scope_for_user
from sources.services import ingestion_run_create, source_create, source_update_config

SAMPLE_QUESTIONS = [
    "Which function turns a request validation error into the 422 JSON response?",
    "How does kbportal keep one tenant from seeing another tenant's documents?",
]
PROGRESS_EVERY_SECONDS = 15
RUN_TIMEOUT_SECONDS = 1800


class Command(BaseCommand):
    help = "Set up and run the demo portal on real data."

    def add_arguments(self, parser):
        parser.add_argument("--slack-export", help="a Slack workspace export folder or ZIP to add")
        parser.add_argument("--docs", help="a Markdown/HTML docs folder to add")
        parser.add_argument("--port", type=int, default=int(os.environ.get("KB_PORT", "8000")))
        parser.add_argument("--no-serve", action="store_true", help="exit after the sample questions")

    def handle(self, *args, slack_export=None, docs=None, port=8000, no_serve=False, **options):
        t_start = time.perf_counter()
        call_command("migrate", verbosity=0)
        password_file = settings.VAR_DIR / "demo_admin_password"
        if not password_file.exists():
            password_file.write_text(secrets.token_urlsafe(12))
            password_file.chmod(0o600)
        password = password_file.read_text().strip()
        onboarded = tenant_onboard(
            name="Demo Company",
            slug="demo",
            admin_username="admin",
            admin_password=password,
            admin_email="admin@demo.example",
            project_name="Everything",
            superuser=True,
        )
        tenant_id, project_id = onboarded.tenant.pk, onboarded.project.pk
        specs = self._source_specs(slack_export, docs)
        sources = [self._ensure_source(tenant_id, project_id, spec) for spec in specs]

        procs = self._start_services(port, no_serve)

        def stop_quietly() -> None:  # a second signal (a process group's kill, Ctrl-C twice) stops nothing twice
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                signal.signal(sig, signal.SIG_IGN)

        def stop_on_sigterm(signum, frame):  # `kill` stops the worker and web server too, as Ctrl-C does
            stop_quietly()
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, stop_on_sigterm)
        signal.signal(signal.SIGHUP, stop_on_sigterm)  # a closed terminal: no orphan worker, beat or server
        if not no_serve:
            self.stdout.write(f"web: http://127.0.0.1:{port}/  login: admin / {password}  (usable while ingesting)")
        try:
            from sources.tasks import ingest_source

            pending = []
            for source in sources:
                run = ingestion_run_create(tenant_id=tenant_id, source_id=source.pk)
                ingest_source.delay(tenant_id, source.pk, run.pk)
                pending.append((source, run.pk))
            self.stdout.write(f"queued {len(pending)} ingestion runs on the Celery worker; waiting...")
            self._wait_for_runs(tenant_id, pending, procs)

            scope = scope_for_user(onboarded.admin)
            for question in SAMPLE_QUESTIONS:
                result = ask(question, scope)
                self.stdout.write(self.style.MIGRATE_HEADING(f"\nQ: {question}"))
                self.stdout.write(answer_terminal_text(result.answer.text))
                for ev in result.sources or result.evidence[:3]:
                    self.stdout.write(f"  [{ev.n}] {ev.title} — {ev.url}")
                self.stdout.write(f"  ({result.timings_ms['total']:.0f} ms, tools: {', '.join(result.plan['tools'])})")
            web = "" if no_serve else f"  web:   http://127.0.0.1:{port}/   (admin: http://127.0.0.1:{port}/admin/)\n"
            self.stdout.write(
                self.style.SUCCESS(
                    f"\nkbportal demo ready in {time.perf_counter() - t_start:.0f}s\n{web}"
                    f"  login: admin / {password}\n"
                    f'  ask:   .venv/bin/python manage.py ask --tenant demo --project everything "your question"'
                )
            )
            if no_serve:
                return
            self.stdout.write("serving; press Ctrl-C to stop")
            while all(p.poll() is None for p in procs.values()):
                time.sleep(1)
            dead = [name for name, p in procs.items() if p.poll() is not None]
            raise CommandError(f"{', '.join(dead)} stopped; see {settings.VAR_DIR / 'log'}")
        except KeyboardInterrupt:
            stop_quietly()
            self.stdout.write("stopping")
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs.values():
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()

    def _source_specs(self, slack_export: str | None, docs: str | None) -> list[dict]:
        base = Path(settings.BASE_DIR)
        specs = [
            # The sdist is imported in one synthetic commit: no history worth a row (and no
            # "kbportal" committer for who_knows to credit).
            {
                "slug": "fastapi",
                "name": "FastAPI 0.141.1 source",
                "kind": "git",
                "config": {"path": str(fastapi_source_checkout()), "max_commits": 0},
                "include": ["fastapi/*"],
            },
            # Its Markdown is the docs source's (pages and sections): not indexed twice.
            {
                "slug": "kbportal-repo",
                "name": "kbportal repository (code and history)",
                "kind": "git",
                "config": {"path": str(base)},
                "exclude": ["*.md"],
            },
            {
                "slug": "kbportal-docs",
                "name": "kbportal docs",
                "kind": "docs",
                "config": {"path": str(base), "glob": ["*.md", "docs/**/*.md"]},
            },
        ]
        if slack_export:
            path = Path(slack_export).resolve()
            if not path.exists():
                raise CommandError(f"--slack-export {path} does not exist")
            specs.append(
                {
                    "slug": "slack",
                    "name": f"Slack export {path.name}",
                    "kind": "slack_export",
                    "config": {"path": str(path)},
                }
            )
        if docs:
            path = Path(docs).resolve()
            if not path.is_dir():
                raise CommandError(f"--docs {path} is not a folder")
            specs.append({"slug": "docs", "name": f"Docs {path.name}", "kind": "docs", "config": {"path": str(path)}})
        return specs

    def _ensure_source(self, tenant_id: int, project_id: int, spec: dict) -> DataSource:
        with tenant_context(tenant_id):
            source = DataSource.objects.filter(slug=spec["slug"]).first()
        if source is None:
            return source_create(
                tenant_id=tenant_id,
                kind=spec["kind"],
                name=spec["name"],
                slug=spec["slug"],
                config=spec["config"],
                include=spec.get("include"),
                exclude=spec.get("exclude"),
                project_ids=[project_id],
            )
        if source.config != spec["config"]:
            source_update_config(tenant_id=tenant_id, source_id=source.pk, config=spec["config"])
        return source

    def _start_services(self, port: int, no_serve: bool) -> dict[str, subprocess.Popen]:
        log_dir = settings.VAR_DIR / "log"
        log_dir.mkdir(parents=True, exist_ok=True)
        python = sys.executable
        base = str(settings.BASE_DIR)
        procs = {}
        worker_cmd = [
            python,
            "-m",
            "celery",
            "-A",
            "kbportal",
            "worker",
            "-Q",
            "ingest,default",
            "--pool",
            "solo",
            "--loglevel",
            "INFO",
        ]
        procs["celery worker"] = subprocess.Popen(
            worker_cmd,
            cwd=base,
            stdout=open(log_dir / "worker.log", "a"),
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the demo, which then stops its children
        )
        # Beat queues each source's scheduled syncs (sources.scheduling), as under ``manage.py serve``:
        # a source added in /manage/ syncs on its schedule here too.
        beat_cmd = [
            python,
            "-m",
            "celery",
            "-A",
            "kbportal",
            "beat",
            "--loglevel",
            "INFO",
            "--schedule",
            str(settings.VAR_DIR / "celerybeat-schedule"),
        ]
        procs["celery beat"] = subprocess.Popen(
            beat_cmd, cwd=base, stdout=open(log_dir / "beat.log", "a"), stderr=subprocess.STDOUT, start_new_session=True
        )
        if not no_serve:
            web_cmd = [python, "manage.py", "runserver", "--noreload", "--insecure", f"127.0.0.1:{port}"]
            procs["web server"] = subprocess.Popen(
                web_cmd,
                cwd=base,
                stdout=open(log_dir / "web.log", "a"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.stdout.write(f"started {', '.join(procs)} (logs in {log_dir})")
        return procs

    def _wait_for_runs(self, tenant_id: int, pending: list, procs: dict) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
        next_progress = time.monotonic() + PROGRESS_EVERY_SECONDS
        reported: set[int] = set()
        while len(reported) < len(pending):
            if time.monotonic() >= next_progress:
                next_progress = time.monotonic() + PROGRESS_EVERY_SECONDS
                with tenant_context(tenant_id):
                    running = IngestionRun.objects.filter(
                        pk__in=[r for _, r in pending if r not in reported]
                    ).select_related("source")
                    now = timezone.now()
                    line = "; ".join(f"{run.source.name}: {run.status}, {run.progress_label(now)}" for run in running)
                self.stdout.write(f"  ... {line}")
            if time.monotonic() > deadline:
                raise CommandError("ingestion did not finish in time; see var/log/worker.log")
            worker = procs["celery worker"]
            if worker.poll() is not None:
                raise CommandError(f"the Celery worker exited ({worker.returncode}); see var/log/worker.log")
            for source, run_id in pending:
                if run_id in reported:
                    continue
                with tenant_context(tenant_id):
                    run = IngestionRun.objects.get(pk=run_id)
                if run.status in {"succeeded", "partial", "failed"}:
                    reported.add(run_id)
                    style = self.style.ERROR if run.status == "failed" else self.style.SUCCESS
                    self.stdout.write(
                        style(
                            f"  {source.name}: {run.status}, {run.seen} rows ({run.embedded} embedded, "
                            f"{run.skipped} skipped) in {run.duration_seconds or 0:.1f}s"
                            + (f": {run.error}" if run.error else "")
                        )
                    )
            time.sleep(1)
