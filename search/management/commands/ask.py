"""``manage.py ask "question" [--project SLUG] [--tenant SLUG] [--user NAME] [--json]``."""

import json

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from projects.selectors import ScopeNotFound
from search.rendering import answer_terminal_text
from search.retrieval import InvalidQuery
from search.services import ask
from sources.selectors import scope_for_operator, scope_for_user


class Command(BaseCommand):
    help = "Ask a question; prints the cited answer, the tools used and the numbered sources."

    def add_arguments(self, parser):
        parser.add_argument("question")
        parser.add_argument("--project", help="project slug (default: the user's default project)")
        parser.add_argument("--tenant", help="tenant slug (needed when there are several)")
        parser.add_argument("--user", help="ask as this user (their tenant, project and permissions)")
        parser.add_argument("--json", action="store_true", help="print the whole result as JSON")

    def handle(self, *args, question, project=None, tenant=None, user=None, json=False, **options):
        try:
            if user:
                account = get_user_model().objects.filter(username=user).first()
                if account is None:
                    raise CommandError(f"no user {user!r}")
                scope = scope_for_user(account, project)
            else:
                scope = scope_for_operator(tenant_slug=tenant, project_slug=project)
            result = ask(question, scope)
        except (ScopeNotFound, InvalidQuery) as exc:
            raise CommandError(str(exc)) from exc
        if json:
            self.stdout.write(_json_dumps(result.as_dict()))
            return
        self.stdout.write(self.style.MIGRATE_HEADING(f"Q: {result.question}"))
        self.stdout.write(answer_terminal_text(result.answer.text))
        tools = ", ".join(
            f"{t['tool']} ({t.get('rows', 0)} rows)" if "error" not in t else f"{t['tool']} (failed: {t['error']})"
            for t in result.tools_run
        )
        verdict = result.verdict
        decided = f"{verdict.status} ({verdict.decided_by})" if verdict else "-"
        self.stdout.write(
            f"\nTools: {tools}  [planner: {result.plan['planner']}, answerable: {decided}, "
            f"synthesizer: {result.answer.synthesizer}, {result.timings_ms['total']:.0f} ms]"
        )
        if result.sources:
            self.stdout.write("Sources:")
            for ev in result.sources:
                where = ev.url or ev.location  # a person row has neither: its documents are its sources
                self.stdout.write(f"  [{ev.n}] {ev.title}" + (f" — {where}" if where else ""))
                for section in ev.sections:
                    self.stdout.write(f"       also {section['title']} — {section['location']}")


def _json_dumps(data) -> str:
    return json.dumps(data, indent=2, default=str, ensure_ascii=False)
