"""Slack bot: mention-to-answer latency through the loopback Slack (Web API + Socket Mode).

Starts the loopback Slack of the tests (``tests/sources/slack_server.py``: the real wire
formats, reached through ``slack_sdk``), runs ``manage.py slack_listen --answer`` against it on
a thread (one Socket Mode connection, as in production), and replays the scripted dialogues of
``bench/dialogues/`` as Slack mentions: each dialogue's first turn in a channel, its follow-ups
in that thread, one at a time. Latency = from the envelope's send to the bot's
``chat.postMessage`` arriving at the loopback server (ack, identity lookup, the whole answer
pipeline without an LLM, formatting, the Web API call).

The questions run over the FastAPI docs (``../shared/corpora/fastapi-docs``) indexed once into
the tenant ``bench-slack-bot`` (a docs source; first run about 2 minutes), answered as a member
whose Slack identity is linked by a verified email (the per-user question limit raised for the
run). Each run adds a throwaway Slack source and deletes it at the end.

    .venv/bin/python bench/slack_bot_latency.py [--dialogues FILE] [--limit N]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kbportal.settings")
# One asker sends every question here: the per-user question limit (30/m by default) would turn
# most replies into "try again later". The limit is the web page's; it is not what is measured.
os.environ.setdefault("KB_ASK_RATE", "100000/m")
SHARED = ROOT.parent / "shared"
TENANT = "bench-slack-bot"
CHANNEL = "C0BENCH"
ASKER = "U0BENCHASKER"


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def setup_tenant():
    """The bench tenant, its asker (a member with a verified email) and its docs source, indexed once."""
    from allauth.account.models import EmailAddress
    from django.contrib.auth import get_user_model

    from kbportal.tenancy import tenant_context
    from projects.models import Membership, Tenant
    from projects.services import membership_create, profile_set_default_project, tenant_onboard
    from sources.models import DataSource
    from sources.services import source_create, source_ingest

    tenant = Tenant.objects.filter(slug=TENANT).first()
    if tenant is None:
        onboarded = tenant_onboard(
            name=TENANT, slug=TENANT, admin_username=f"{TENANT}-admin", admin_password="unused-" + TENANT
        )
        tenant, project = onboarded.tenant, onboarded.project
    else:
        from projects.models import Project

        with tenant_context(tenant.pk):
            project = Project.objects.get(slug="everything")
    User = get_user_model()
    asker = User.objects.filter(username=f"{TENANT}-asker").first()
    if asker is None:
        asker = User.objects.create_user(f"{TENANT}-asker", f"asker@{TENANT}.example", None)
        membership_create(tenant_id=tenant.pk, user=asker, role=Membership.Role.MEMBER)
        profile_set_default_project(user=asker, tenant_id=tenant.pk, project_id=project.pk)
        EmailAddress.objects.create(user=asker, email=f"asker@{TENANT}.example", verified=True, primary=True)
    with tenant_context(tenant.pk):
        docs = DataSource.objects.filter(slug="fastapi-docs").first()
    if docs is None:
        docs = source_create(
            tenant_id=tenant.pk,
            kind="docs",
            name="FastAPI docs",
            slug="fastapi-docs",
            config={"path": str(SHARED / "corpora" / "fastapi-docs"), "glob": ["docs/en/docs/**/*.md"]},
            project_ids=[project.pk],
        )
    with tenant_context(tenant.pk):
        indexed = docs.documents.exists()
    if not indexed:
        t0 = time.perf_counter()
        run = source_ingest(tenant_id=tenant.pk, source_id=docs.pk)
        print(f"indexed the FastAPI docs: {run.status}, {time.perf_counter() - t0:.0f} s", flush=True)
    return tenant, project, asker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dialogues", type=Path, default=ROOT / "bench" / "dialogues" / "fastapi_dev.jsonl")
    parser.add_argument("--limit", type=int, default=0, help="replay at most this many dialogues (0: all)")
    args = parser.parse_args()
    if not (SHARED / "corpora" / "fastapi-docs").is_dir():
        raise SystemExit(f"needs {SHARED / 'corpora' / 'fastapi-docs'}")

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    from kbportal.tenancy import tenant_context
    from search.llm import without_llm
    from sources.models import ExternalIdentity
    from sources.services import source_create
    from sources.services.managed import managed_source_delete
    from tests.sources.slack_server import APP_TOKEN, BOT_TOKEN, FakeSlack, SlackWorld

    tenant, project, asker = setup_tenant()
    dialogues = [json.loads(line) for line in args.dialogues.read_text().splitlines() if line.strip()]
    if args.limit:
        dialogues = dialogues[: args.limit]
    server = FakeSlack(SlackWorld(channels={CHANNEL: "bench"}, users={ASKER: {"real_name": "Asker"}}))
    slack = source_create(
        tenant_id=tenant.pk,
        kind="slack",
        name="Slack (bench)",
        slug=f"slack-bench-{int(time.time())}",
        config={
            "token": BOT_TOKEN,
            "app_token": APP_TOKEN,
            "base_url": server.base_url,
            "channels": [CHANNEL],
            "allow_private_network": True,  # the loopback Slack
        },
        project_ids=[project.pk],
    )
    with tenant_context(tenant.pk):
        ExternalIdentity.objects.create(tenant=tenant, source=slack, principal=f"slack:{ASKER}", email=asker.email)
    stop, out, errors = threading.Event(), io.StringIO(), []

    def listen() -> None:
        try:
            with without_llm():
                call_command(
                    "slack_listen", "--source", f"{TENANT}/{slack.slug}", "--answer", stop_event=stop, stdout=out
                )
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while "listening" not in out.getvalue() and not errors and time.monotonic() < deadline:
            time.sleep(0.05)
        if errors or "listening" not in out.getvalue():
            raise SystemExit(f"the listener did not start: {errors or out.getvalue()}")
        first_turns: list[float] = []
        follow_ups: list[float] = []
        n = 0
        for dialogue in dialogues:
            thread_ts = None
            for index, turn in enumerate(dialogue["turns"]):
                n += 1
                ts = f"{int(time.time())}.{n:06d}"
                event = {"type": "app_mention", "user": ASKER, "text": f"<@U0BOT> {turn['question']}", "ts": ts}
                event.update(channel=CHANNEL, event_ts=ts, **({"thread_ts": thread_ts} if thread_ts else {}))
                thread_ts = thread_ts or ts
                envelope = server.push(event, event_id=f"EvBench{n:05d}")
                posted = server.wait_posted(n, timeout=120)[n - 1]
                if "too many questions" in posted["text"] or "direct message" in posted["text"]:
                    raise SystemExit(f"the bot refused the question: {posted['text']}")
                seconds = posted["at"] - server.sent[envelope]
                (first_turns if index == 0 else follow_ups).append(seconds * 1000)
    finally:
        stop.set()
        thread.join(60)
        server.close()
        managed_source_delete(tenant_id=tenant.pk, source_id=slack.pk)
    print(f"{'mentions':12} {'n':>4} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8}")
    for label, values in (("first turn", first_turns), ("follow-up", follow_ups), ("all", first_turns + follow_ups)):
        if values:
            print(
                f"{label:12} {len(values):>4} {percentile(values, 50):>8.0f} {percentile(values, 95):>8.0f} "
                f"{statistics.fmean(values):>8.0f}"
            )
    print(out.getvalue().strip().splitlines()[-1])


if __name__ == "__main__":
    main()
