"""``manage.py kb_eval --set fastapi|erb [--questions FILE] [--json] [--rankers LIST] [--no-rerank] [--answers]``.

Indexes the set's corpus into a dedicated evaluation tenant (``eval-<set>``) first; re-runs are
idempotent and re-embed nothing unless the corpus changed. Then reports recall@1/3/10, MRR and
nDCG@10 per question type and overall, and search latency p50/p95. ``--answers`` runs the
whole ask pipeline instead and reports declines, facts stated, citation validity and latency
(``search.evaluation_answers``).
"""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from kbportal.tenancy import tenant_context
from projects.models import Project, Tenant
from projects.selectors import ScopeNotFound
from projects.services import project_create
from search.evaluation import (
    EvalInputError,
    django_source_checkout,
    evaluate,
    fastapi_source_checkout,
    load_questions,
)
from search.evaluation_answers import evaluate_answers
from search.retrieval import ALL_RANKERS, OPTIONAL_RANKERS
from sources.models import DataSource
from sources.selectors import scope_for_operator
from sources.services import source_create, source_ingest, source_update_config

SHARED = Path(settings.BASE_DIR).parent / "shared"


EVAL_SETS = Path(settings.BASE_DIR) / "bench" / "eval_sets.json"  # each set's data sources, with its field names


def _corpus(name: str) -> list[dict]:
    """The data sources of evaluation set ``name`` (``bench/eval_sets.json``), paths filled in.
    Raises ``CommandError`` for an unknown set."""
    sets = {k: v for k, v in json.loads(EVAL_SETS.read_text(encoding="utf-8")).items() if not k.startswith("_")}
    if name not in sets:
        raise CommandError(f"unknown evaluation set {name!r}; use {' or '.join(sorted(sets))}")

    def fill(value):
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        if value == "{fastapi_checkout}":
            return str(fastapi_source_checkout())
        return value.replace("{shared}", str(SHARED)) if isinstance(value, str) else value

    return fill(sets[name])


def _haystack() -> list[dict]:
    """Unrelated material added to a set's project (``shared/eval/README.md``, "Haystack"):
    Django's source (without its locale files) as a git source and its reStructuredText docs."""
    django = django_source_checkout()
    return [
        {
            "slug": "haystack-django-code",
            "kind": "git",
            "config": {"path": str(django), "max_commits": 0},
            "include": ["django/*"],
            "exclude": ["django/conf/locale/*"],
        },
        {
            "slug": "haystack-django-docs",
            "kind": "docs",
            "config": {"path": str(django / "docs"), "glob": ["**/*.txt"], "text_format": "rst"},
        },
    ]


class Command(BaseCommand):
    help = "Evaluate retrieval on a gold-labelled question set (indexes its corpus first)."

    def add_arguments(self, parser):
        parser.add_argument("--set", dest="set_name", required=True, choices=["fastapi", "erb"])
        parser.add_argument("--questions", help="questions JSONL (default: the set's shared questions file)")
        parser.add_argument("--json", action="store_true")
        parser.add_argument(
            "--rankers", help="comma-separated rankers (default lexical,dense,symbol; recency is opt-in)"
        )
        parser.add_argument("--skip-index", action="store_true", help="use the index as it is")
        parser.add_argument(
            "--no-rerank",
            action="store_true",
            help="skip the near-duplicate collapse and the reranker (fusion order; the ablation)",
        )
        parser.add_argument(
            "--answers", action="store_true", help="evaluate whole answers (declines, facts, citations, latency)"
        )
        parser.add_argument(
            "--tenant",
            help="evaluate this tenant's project as it is (with --project; nothing is indexed), e.g. the demo's",
        )
        parser.add_argument("--project", help="the project of --tenant")
        parser.add_argument(
            "--haystack",
            action="store_true",
            help="add Django's source and docs as unrelated material (its own tenant, eval-<set>-haystack)",
        )

    def handle(
        self,
        *args,
        set_name,
        questions=None,
        json=False,
        rankers=None,
        skip_index=False,
        answers=False,
        no_rerank=False,
        haystack=False,
        tenant=None,
        project=None,
        **options,
    ):
        qpath = Path(questions) if questions else SHARED / "eval" / set_name / "questions.jsonl"
        try:
            qs = load_questions(qpath)
        except EvalInputError as exc:
            raise CommandError(str(exc)) from exc
        if tenant:
            if not project:
                raise CommandError("--tenant needs --project")
            try:
                scope = scope_for_operator(tenant_slug=tenant, project_slug=project)
            except ScopeNotFound as exc:
                raise CommandError(str(exc)) from exc
        else:
            tenant_slug = f"eval-{set_name}-haystack" if haystack else f"eval-{set_name}"
            if not skip_index:
                if DataSource._meta.db_table not in connection.introspection.table_names():
                    call_command("migrate", verbosity=0)  # a fresh database: its tables first, as demo does
                self._index(tenant_slug, set_name, haystack=haystack)
            scope = scope_for_operator(tenant_slug=tenant_slug, project_slug=set_name)
        ranker_list = [r.strip() for r in rankers.split(",") if r.strip()] if rankers else None
        known = set(ALL_RANKERS) | set(OPTIONAL_RANKERS)
        if ranker_list is not None and (not ranker_list or set(ranker_list) - known):
            raise CommandError(f"--rankers {rankers!r}: choose from {', '.join(sorted(known))}")
        if answers:
            report = evaluate_answers(qs, scope)
            report["set"] = set_name
            report["haystack"] = haystack
            if json:
                import json as jsonlib

                self.stdout.write(jsonlib.dumps(report, indent=2))
            else:
                self._print_answers(report)
            return
        report = evaluate(qs, scope, rankers=ranker_list, rerank=not no_rerank)
        report["set"] = set_name
        report["haystack"] = haystack
        report["questions_file"] = str(qpath)
        if json:
            import json as jsonlib

            self.stdout.write(jsonlib.dumps(report, indent=2))
            return
        self._print(report)

    def _index(self, tenant_slug: str, set_name: str, *, haystack: bool = False) -> None:
        tenant, _ = Tenant.objects.get_or_create(slug=tenant_slug, defaults={"name": f"Evaluation: {set_name}"})
        with tenant_context(tenant.pk):
            project = Project.objects.filter(slug=set_name).first()
        if project is None:
            project = project_create(tenant_id=tenant.pk, name=set_name, slug=set_name)
        for spec in _corpus(set_name) + (_haystack() if haystack else []):
            with tenant_context(tenant.pk):
                source = DataSource.objects.filter(slug=spec["slug"]).first()
            if source is None:
                source = source_create(
                    tenant_id=tenant.pk,
                    kind=spec["kind"],
                    name=spec["slug"],
                    slug=spec["slug"],
                    config=spec["config"],
                    include=spec.get("include"),
                    exclude=spec.get("exclude"),
                    project_ids=[project.pk],
                )
            elif source.config != spec["config"]:
                source_update_config(tenant_id=tenant.pk, source_id=source.pk, config=spec["config"])
            run = source_ingest(tenant_id=tenant.pk, source_id=source.pk)
            self.stderr.write(
                f"indexed {spec['slug']}: {run.status}, {run.seen} rows, {run.embedded} embedded, "
                f"{run.duration_seconds or 0:.1f}s"
            )
            if run.status == "failed":
                raise CommandError(f"indexing {spec['slug']} failed: {run.error}")

    def _print(self, report: dict) -> None:
        cols = ["n", "recall@1", "recall@3", "recall@10", "mrr", "ndcg@10"]
        self.stdout.write(f"{'type':<16}" + "".join(f"{c:>10}" for c in cols))
        for name, row in [*report["by_type"].items(), ("OVERALL", report["overall"])]:
            self.stdout.write(f"{name:<16}" + "".join(f"{row.get(c, ''):>10}" for c in cols))
        lat = report.get("latency_ms") or {}
        self.stdout.write(f"search latency: p50 {lat.get('p50')} ms, p95 {lat.get('p95')} ms")

    def _print_answers(self, report: dict) -> None:
        cols = ["n", "declined", "facts", "cited_gold"]
        self.stdout.write(f"{'type':<16}" + "".join(f"{c:>12}" for c in cols))
        for name, row in [*report["by_type"].items(), ("OVERALL", report["overall"])]:
            cells = "".join(f"{'-' if row.get(c) is None else row[c]:>12}" for c in cols)
            self.stdout.write(f"{name:<16}" + cells)
        cit, lat = report["citations"], report["latency_ms"]
        self.stdout.write(
            f"unanswerable declined: {report['unanswerable_declined']}; "
            f"answerable declined: {report['answerable_declined']}"
        )
        if report["overall"].get("facts") is None:
            self.stdout.write("facts: not judged (set OPENAI_BASE_URL and KB_LLM_MODEL for an LLM judge)")
        self.stdout.write(f"citations: {cit['valid']} valid, {cit['removed']} removed, validity {cit['validity']}")
        self.stdout.write(
            f"first token: p50 {lat['first_token_p50']} ms, p95 {lat['first_token_p95']} ms; "
            f"total: p50 {lat['total_p50']} ms, p95 {lat['total_p95']} ms "
            f"(synthesizer: {', '.join(report['synthesizers'])})"
        )
