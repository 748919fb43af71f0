"""``manage.py serve``: the portal under a production server, with its Celery worker and beat.

Migrates, collects static files into ``STATIC_ROOT`` (served by WhiteNoise from the app
itself), then starts and watches three processes:

- **web**: gunicorn with threaded workers (``gthread``: each request, and each server-sent
  events stream of ``/ask/stream``, holds one thread; ``--workers`` x ``--threads`` requests run
  at once), bound to ``--bind``;
- **worker**: a Celery worker on the ``ingest`` and ``default`` queues (``--no-worker`` when it
  runs elsewhere);
- **beat**: Celery beat with the database scheduler, which queues due syncs (``--no-beat``).

Their output goes to this terminal, each line prefixed by the process name. Ctrl-C, SIGTERM,
SIGHUP (the terminal closing) or SIGQUIT stops all three (gunicorn finishes the requests under
way, for up to 30 s); if one of them exits, the others are stopped and the command fails naming
it. Each serves from its own process group, which is what is signalled, workers included.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

GRACEFUL_SECONDS = 30  # gunicorn's --graceful-timeout: requests under way get this long
STOP_GRACE_SECONDS = GRACEFUL_SECONDS + 5  # then each process group is killed
CONN_MAX_AGE_SECONDS = 60


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def process_commands(
    *, bind: str, workers: int, threads: int, timeout: int, worker: bool, beat: bool
) -> dict[str, list[str]]:
    """Process name -> argv of the processes ``serve`` runs (see the module docstring)."""
    python = sys.executable
    commands = {
        "web": [
            python,
            "-m",
            "gunicorn",
            "kbportal.wsgi:application",
            "--bind",
            bind,
            "--workers",
            str(workers),
            "--worker-class",
            "gthread",
            "--threads",
            str(threads),
            # A worker process whose main loop is silent this long is restarted. With gthread the
            # requests run on other threads, so a long answer stream does not trip it.
            "--timeout",
            str(timeout),
            "--graceful-timeout",
            str(GRACEFUL_SECONDS),
            "--access-logfile",
            "-",
            "--error-logfile",
            "-",
            # Gunicorn's control socket defaults to one per OS user (~/.gunicorn): two portals of one
            # user would take it from each other. Each checkout keeps its own under var/.
            "--control-socket",
            str(settings.VAR_DIR / "gunicorn.ctl"),
        ],
    }
    if worker:
        commands["worker"] = [
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
    if beat:
        commands["beat"] = [
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
    return commands


def _relay(name: str, stream: IO[bytes], out: IO[str], lock: threading.Lock) -> None:
    """Copy a child's output lines to ``out``, prefixed; once ``out`` breaks (a closed pipe), keep
    draining the child's pipe, so the child never blocks on a full one."""
    broken = False
    for raw in iter(stream.readline, b""):
        if broken:
            continue
        try:
            with lock:
                out.write(f"[{name}] {raw.decode(errors='replace').rstrip()}\n")
                out.flush()
        except (OSError, ValueError):
            broken = True


class Command(BaseCommand):
    help = "Run the portal under gunicorn (static files by WhiteNoise) with a Celery worker and beat."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=os.environ.get("KB_BIND", "127.0.0.1:8000"), help="host:port")
        parser.add_argument(
            "--workers",
            type=int,
            default=int(os.environ.get("KB_WEB_WORKERS", "0")) or _cores(),
            help="gunicorn worker processes (default: one per core; each loads the embedding model)",
        )
        parser.add_argument(
            "--threads",
            type=int,
            default=int(os.environ.get("KB_WEB_THREADS", "8")),
            help="threads per worker: requests (and open answer streams) served at once per worker",
        )
        parser.add_argument("--timeout", type=int, default=120, help="seconds before a silent worker is restarted")
        parser.add_argument("--no-worker", action="store_true", help="do not start a Celery worker")
        parser.add_argument("--no-beat", action="store_true", help="do not start Celery beat")

    def handle(self, *args, bind, workers, threads, timeout, no_worker=False, no_beat=False, **options):
        if workers < 1 or threads < 1:
            raise CommandError(f"--workers and --threads must be at least 1 (got {workers} and {threads})")
        call_command("migrate", verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        commands = process_commands(
            bind=bind, workers=workers, threads=threads, timeout=timeout, worker=not no_worker, beat=not no_beat
        )
        # Each gunicorn thread keeps its database connection between requests (see settings).
        env = {**os.environ, "KB_CONN_MAX_AGE": os.environ.get("KB_CONN_MAX_AGE", str(CONN_MAX_AGE_SECONDS))}
        lock = threading.Lock()
        procs: dict[str, subprocess.Popen] = {}
        stopping = threading.Event()

        def stop(*_):
            stopping.set()

        # The terminal closing (SIGHUP) or a quit stops the children too: they run in their own
        # process groups, so nothing else would.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(signum, stop)
        try:
            for name, argv in commands.items():
                proc = subprocess.Popen(
                    argv,
                    cwd=settings.BASE_DIR,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,  # Ctrl-C reaches this command, which stops them in order
                )
                procs[name] = proc
                assert proc.stdout is not None
                threading.Thread(target=_relay, args=(name, proc.stdout, self.stdout, lock), daemon=True).start()
            self.stdout.write(
                f"serving http://{bind}/ with {workers} workers x {threads} threads; started {', '.join(procs)}"
            )
            while not stopping.is_set():
                dead = [name for name, proc in procs.items() if proc.poll() is not None]
                if dead:
                    raise CommandError(f"{dead[0]} exited ({procs[dead[0]].returncode}); stopped the others")
                stopping.wait(0.5)
        finally:
            self._stop(procs)

    def _stop(self, procs: dict[str, subprocess.Popen]) -> None:
        """TERM to each child's process group (gunicorn and Celery finish cleanly on it), then,
        after :data:`STOP_GRACE_SECONDS`, KILL to the groups still there: workers included."""
        for proc in procs.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for proc in procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)  # what is left of the group, if anything
            proc.wait()


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)  # the child leads its own group (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass
