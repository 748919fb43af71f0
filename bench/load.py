"""Concurrent users on the production server: throughput, latency and errors, audit log complete.

Usage:

    .venv/bin/python bench/load.py [--users 5,20,50] [--seconds 30] [--think 0 | --pace S] [--mix all|search]

1. Sets up the tenant ``bench-load`` in the configured database (the embedded server by
   default): a user, one API token, and a docs data source over the FastAPI documentation in
   ``../shared/corpora/fastapi-docs`` (or, without it, this repository's own Markdown and
   Python files), ingested once (a later run finds it unchanged). Queries are the titles of
   60 of its indexed sections, chosen with a fixed seed.
2. Starts ``manage.py serve --no-worker --no-beat`` (gunicorn gthread workers, WhiteNoise) on
   127.0.0.1 only, with the per-user question rate limits raised (every simulated person is
   the same account) and no LLM configured, so answers are the extractive ones.
3. For each user count, runs Locust headless (``bench/locustfile.py``; ``--mix all``: web
   search, API search, web answer, API answer, weights 3:3:1:1; ``--mix search``: the two
   searches) for ``--seconds`` with no think time by default (closed loop: each user sends its
   next request when the last one is answered; ``--think S``: a pause of S seconds after each
   answer; ``--pace S``: each user starts one request every S seconds, as a person searching at
   that rate would, so the offered load is users / S requests per second and the latency is
   what each of them waits), and reads its CSV statistics. Locust runs on
   the same cores as the server, as on a one-machine install.
4. Checks the audit log against what the server answered (its access log, over the measured
   levels): one ``api.call`` event per API request whatever its status, one ``search`` event
   per search answered 200, one ``ask`` event per question answered 200.

Prints one table per user count: per request kind, requests, requests/s, p50 and p95 (ms),
failures; then the audit check. Bounded: ``--seconds`` per level, nothing leaves loopback.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kbportal.settings")

TENANT = "bench-load"
USERNAME = "bench-load-user"
SHARED_DOCS = ROOT.parent / "shared" / "corpora" / "fastapi-docs" / "docs" / "en" / "docs"
N_QUERIES = 60
NAMES = ("web search", "api search", "web ask", "api ask")
# Every request goes straight to the loopback server, whatever proxy the environment names.
DIRECT = urllib.request.ProxyHandler({})


LOOPBACK = {"", "localhost", "127.0.0.1", "::1"}


def check_loopback_database() -> None:
    """Refuse a ``DATABASE_URL`` on another host: the bench creates a tenant and resets its user's
    password, which belongs in a local database, never a shared one."""
    url = os.environ.get("DATABASE_URL")
    if url:
        from urllib.parse import urlsplit

        host = urlsplit(url).hostname or ""
        if host not in LOOPBACK and not host.startswith("/"):
            raise SystemExit(f"DATABASE_URL names host {host!r}: bench/load.py runs on a local database only")


def setup() -> tuple[str, str, list[str], int]:
    """(password, API token, queries, tenant id) of the bench tenant, its source indexed."""
    import django

    django.setup()
    from django.core.management import call_command

    from kbportal.tenancy import tenant_context
    from projects.services import api_token_create, tenant_onboard
    from sources.models import DataSource, Document
    from sources.services import source_create, source_ingest

    call_command("migrate", verbosity=0)
    password = secrets.token_urlsafe(16)
    onboarded = tenant_onboard(name="Bench load", slug=TENANT, admin_username=USERNAME, admin_password=password)
    tenant = onboarded.tenant
    if SHARED_DOCS.is_dir():
        config = {"path": str(SHARED_DOCS)}
    else:
        config = {"path": str(ROOT), "glob": ["*.md", "bench/*.py", "search/**/*.py", "sources/**/*.py"]}
    with tenant_context(tenant.pk):
        source = DataSource.objects.filter(slug="bench-load-docs").first()
    if source is None:
        source = source_create(
            tenant_id=tenant.pk,
            kind="docs",
            name="Bench docs",
            slug="bench-load-docs",
            config=config,
            project_ids=[onboarded.project.pk],
        )
    t0 = time.perf_counter()
    run = source_ingest(tenant_id=tenant.pk, source_id=source.pk)
    print(
        f"source {config['path']}: {run.status}, {run.seen} rows ({run.embedded} embedded) in "
        f"{time.perf_counter() - t0:.0f}s",
        flush=True,
    )
    with tenant_context(tenant.pk):
        titles = sorted(
            set(Document.objects.filter(source_id=source.pk, kind="doc_section").values_list("title", flat=True))
        )
    queries = random.Random(7).sample(titles, min(N_QUERIES, len(titles)))
    queries = [q.split(" > ")[-1] for q in queries]  # the section's own heading, as a person types it
    _, token = api_token_create(tenant=tenant, user=onboarded.admin, name=f"bench-load {time.time():.0f}")
    return password, token, queries, tenant.pk


def audit_counts(tenant_id: int) -> dict[str, int]:
    from django.db.models import Count

    from kbportal.models import AuditEvent
    from kbportal.tenancy import tenant_context

    with tenant_context(tenant_id):
        rows = AuditEvent.objects.filter(action__in=["api.call", "search", "ask"]).values("action")
        return {r["action"]: r["n"] for r in rows.annotate(n=Count("id"))}


def login(base: str, password: str) -> str:
    """The session id of a password sign-in through allauth's form."""
    import http.cookiejar
    import re

    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(DIRECT, urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(f"{base}/accounts/login/").read().decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert csrf, "no CSRF token on the login page"
    body = urllib.parse.urlencode({"login": USERNAME, "password": password, "csrfmiddlewaretoken": csrf.group(1)})
    opener.open(urllib.request.Request(f"{base}/accounts/login/", data=body.encode(), headers={"Referer": base}))
    session = next((c.value for c in jar if c.name == "sessionid"), None)
    if not session:
        raise SystemExit("signing in the bench user failed (no session cookie)")
    return session


def wait_ready(base: str, server: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"manage.py serve exited ({server.returncode})")
        try:
            urllib.request.build_opener(DIRECT).open(f"{base}/accounts/login/", timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"the server did not answer on {base} within {seconds:.0f}s")


def served(log: Path, start: int, end: int) -> dict[str, int]:
    """Audit events the requests in bytes ``start:end`` of the server's output must have written,
    read from gunicorn's access log lines (``"GET /search/?q=... HTTP/1.1" 200``)."""
    import re

    line = re.compile(r'"(GET|POST) (/[^ ?"]*)(\?[^ "]*)? HTTP/[\d.]+" (\d{3}) ')
    counts = {"api.call": 0, "search": 0, "ask": 0}
    with log.open("rb") as handle:
        handle.seek(start)
        text = handle.read(end - start).decode(errors="replace")
    for method, path, query, status in line.findall(text):
        asked = bool(query) and "q=" in query
        if path.startswith("/api/v1/"):
            counts["api.call"] += 1
        if status != "200":
            continue
        if path == "/api/v1/search" or (path == "/search/" and asked):
            counts["search"] += 1
        elif path == "/api/v1/ask" and method == "POST" or (path == "/" and asked):
            counts["ask"] += 1
    return counts


def run_level(
    base: str, users: int, seconds: int, think: float, env: dict, workdir: Path, user_class: str, pace: float = 0.0
) -> dict[str, dict]:
    prefix = workdir / f"u{users}"
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(ROOT / "bench" / "locustfile.py"),
        "--headless",
        "-u",
        str(users),
        "-r",
        str(users),
        "-t",
        f"{seconds}s",
        "--host",
        base,
        "--csv",
        str(prefix),
        "--only-summary",
        "--stop-timeout",
        "30",
        "--loglevel",
        "WARNING",
        user_class,
    ]
    pacing = {"KB_LOAD_THINK_SECONDS": str(think), "KB_LOAD_PACE_SECONDS": str(pace)}
    subprocess.run(cmd, env={**env, **pacing}, check=False, stdout=subprocess.DEVNULL)
    stats = {}
    with open(f"{prefix}_stats.csv") as handle:
        for row in csv.DictReader(handle):
            stats[row["Name"]] = {
                "requests": int(row["Request Count"]),
                "failures": int(row["Failure Count"]),
                "rps": float(row["Requests/s"]),
                "p50": float(row["50%"] or 0),
                "p95": float(row["95%"] or 0),
            }
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--users", default="5,20,50", help="comma-separated concurrent user counts")
    parser.add_argument("--seconds", type=int, default=30, help="how long each user count runs")
    parser.add_argument("--think", type=float, default=0.0, help="each user's pause between requests (s)")
    parser.add_argument(
        "--pace", type=float, default=0.0, help="each user starts one request every PACE seconds (overrides --think)"
    )
    parser.add_argument("--mix", choices=["all", "search"], default="all", help="the requests each user sends")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--workers", type=int, default=0, help="gunicorn workers (default: serve's, one per core)")
    args = parser.parse_args()
    levels = [int(u) for u in args.users.split(",")]

    check_loopback_database()
    password, token, queries, tenant_id = setup()
    workdir = Path(tempfile.mkdtemp(prefix="kbportal-load-"))
    (workdir / "queries.json").write_text(json.dumps(queries))
    base = f"http://127.0.0.1:{args.port}"
    server_env = {
        **os.environ,
        "KB_ASK_RATE": "1000000/m",
        "KB_API_THROTTLE": "1000000/min",
        "KB_API_THROTTLE_ASK": "1000000/min",
        "OPENAI_BASE_URL": "",
        "KB_LLM_MODEL": "",
    }
    serve = [sys.executable, "manage.py", "serve", "--no-worker", "--no-beat", "--bind", f"127.0.0.1:{args.port}"]
    if args.workers:
        serve += ["--workers", str(args.workers)]
    log_path = workdir / "serve.log"
    log = log_path.open("w")
    server = subprocess.Popen(serve, cwd=ROOT, env=server_env, stdout=log, stderr=subprocess.STDOUT)
    user_class = {"all": "PortalUser", "search": "SearchUser"}[args.mix]
    try:
        wait_ready(base, server)
        session = login(base, password)
        direct = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
        env = {
            **os.environ,
            **direct,
            "KB_LOAD_QUERIES": str(workdir / "queries.json"),
            "KB_LOAD_SESSION": session,
            "KB_LOAD_TOKEN": token,
        }
        # Warm each worker's embedder and caches before measuring.
        run_level(base, 4, 10, 0, env, workdir, user_class)
        time.sleep(1)
        before, log_start = audit_counts(tenant_id), log_path.stat().st_size
        results = {
            users: run_level(base, users, args.seconds, args.think, env, workdir, user_class, args.pace)
            for users in levels
        }
        time.sleep(2)  # the last requests' access log lines
        after, log_end = audit_counts(tenant_id), log_path.stat().st_size
    finally:
        server.terminate()
        server.wait(timeout=60)
    print(
        f"\n{len(queries)} queries; mix {args.mix}; {args.seconds}s per level; "
        + (f"pace: one request per user every {args.pace}s; " if args.pace else f"think time {args.think}s; ")
        + f"server log {log_path}"
    )
    for users, stats in results.items():
        print(f"\n{users} users")
        print(f"{'request':<11} {'requests':>8} {'req/s':>7} {'p50 ms':>7} {'p95 ms':>7} {'failures':>8}")
        for name in (*NAMES, "Aggregated"):
            st = stats.get(name)
            if st:
                label = "all" if name == "Aggregated" else name
                print(
                    f"{label:<11} {st['requests']:>8} {st['rps']:>7.1f} {st['p50']:>7.0f} {st['p95']:>7.0f} "
                    f"{st['failures']:>8}"
                )
    expected = served(log_path, log_start, log_end)
    print("\naudit log   served  recorded")
    for action, want in expected.items():
        got = after.get(action, 0) - before.get(action, 0)
        print(f"{action:<10} {want:>9} {got:>9}{'' if got == want else '  MISMATCH'}")


if __name__ == "__main__":
    main()
