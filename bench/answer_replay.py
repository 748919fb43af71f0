"""Replay the gate, the synthesizer and the checks over cached evidence, on labelled question sets.

The tools' evidence for each question (the rule planner's plan, run once) is cached under
``var/bench-cache/`` keyed by the set's scope and the question, so that changes to the gate or the
extractive synthesizer are measured on every set in seconds rather than minutes. ``--fresh``
runs the tools again (after a retrieval change). No LLM: ``search.llm.without_llm``.

Prints, per set: unanswerable declined, answerable declined, and how much of the gold answer the
answers state without an LLM judge: ``fact_recall``, the mean share of each ``answer_facts`` item's
content words (lower-cased, stop words out, at least 3 characters) the answer text holds, over
the answerable questions the answer did not decline, and ``facts_half``, the share of facts
with at least half their words in the answer (a cheap proxy for the LLM judge of
``kb_eval --answers``; ERB-format sets only). ``cited_gold``: the share of answered questions
with gold items whose cited sources include one.

Usage (after ``manage.py kb_eval --set fastapi`` and ``--set erb`` indexed their tenants):

    .venv/bin/python bench/answer_replay.py [--set NAME=TENANT/PROJECT:QUESTIONS.jsonl ...] [--fresh]
        [--json OUT] [--show declined|answered|all] [--only NAME]

Default sets: every question file of ``bench/answerability/`` and the shared FastAPI and ERB sets.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kbportal.settings")
SHARED = ROOT.parent / "shared"
CACHE = ROOT / "var" / "bench-cache"


def default_sets() -> list[str]:
    specs = []
    for path in sorted((ROOT / "bench/answerability").glob("*.jsonl")):
        name = path.stem
        if name.startswith("demo"):
            continue
        tenant = "eval-erb/erb" if name.startswith("erb") else "eval-fastapi/fastapi"
        specs.append(f"{name}={tenant}:{path}")
    specs.append(f"fastapi_shared=eval-fastapi/fastapi:{SHARED / 'eval/fastapi/questions.jsonl'}")
    specs.append(f"erb_shared=eval-erb/erb:{SHARED / 'eval/erb/questions.jsonl'}")
    return specs


_WORD = re.compile(r"[^\W_]+(?:[._/-][^\W_]+)*")
_STOP = frozenset(
    """the and for with that this from was were are its our their they them what when who how which into onto
    than then there here have has had not but per via all any each use used uses using can will would should""".split()
)


def fact_words(text: str) -> set[str]:
    return {w for w in (m.group(0).lower() for m in _WORD.finditer(text)) if len(w) >= 3 and w not in _STOP}


def fact_share(answer: str, fact: str) -> float:
    words = fact_words(fact)
    if not words:
        return 1.0
    held = fact_words(answer)
    return len(words & held) / len(words)


def cached_evidence(name: str, scope, question: str, *, fresh: bool):
    from search.llm import without_llm
    from search.pipeline.executor import execute_plan
    from search.pipeline.planner import rule_plan

    key = hashlib.sha1(f"{scope.tenant_id}/{scope.project_id}\n{question}".encode()).hexdigest()
    path = CACHE / f"{key}.pickle"
    if path.exists() and not fresh:
        with path.open("rb") as f:
            return pickle.load(f)
    with without_llm():
        evidence = execute_plan(rule_plan(question), scope).evidence
    CACHE.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        pickle.dump(evidence, f)
    return evidence


def replay(spec: str, *, fresh: bool) -> list[dict]:
    from answerability_calibrate import parse_set

    from search.evaluation import load_questions
    from search.evaluation_answers import _cites_gold
    from search.llm import without_llm
    from search.pipeline.checks import check_answer
    from search.pipeline.drafts import Draft
    from search.pipeline.gate import judge
    from search.pipeline.synthesizer import synthesize_stream

    name, scope, path = parse_set(spec)
    rows = []
    for q in load_questions(path):
        if q.type == "high_level":
            continue
        evidence = cached_evidence(name, scope, q.text, fresh=fresh)
        with without_llm():
            verdict = judge(q.text, evidence, scope)
            draft = next(
                item for item in synthesize_stream(q.text, evidence, verdict=verdict) if isinstance(item, Draft)
            )
            answer = check_answer(q.text, evidence, verdict, draft)
        sources = [ev for ev in evidence if ev.n in set(answer.cited)]
        facts = [fact_share(answer.text, f) for f in q.facts]
        rows.append(
            {
                "set": name,
                "id": q.id,
                "unanswerable": q.type == "unanswerable",
                "question": q.text,
                "declined": not answer.answered,
                "status": verdict.status,
                "probability": verdict.probability,
                "features": verdict.features,
                "missing": [*verdict.missing_terms, verdict.missing_focus, verdict.missing_type],
                "facts": facts,
                "cited_gold": _cites_gold(q, sources) if q.gold and answer.answered else None,
                "answer": answer.text,
            }
        )
    return rows


def summary(rows: list[dict]) -> dict:
    def share(values):
        return round(sum(values) / len(values), 3) if values else None

    unans = [r for r in rows if r["unanswerable"]]
    ans = [r for r in rows if not r["unanswerable"]]
    answered_facts = [f for r in ans if not r["declined"] for f in r["facts"]]
    all_facts = [f if not r["declined"] else 0.0 for r in ans for f in r["facts"]]
    return {
        "n": f"{len(unans)}/{len(ans)}",
        "unans_declined": share([r["declined"] for r in unans]),
        "ans_declined": share([r["declined"] for r in ans]),
        "fact_recall": share(answered_facts),
        "facts_half_all": share([f >= 0.5 for f in all_facts]),
        "cited_gold": share([r["cited_gold"] for r in ans if r["cited_gold"] is not None]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", action="append", dest="sets", help="NAME=TENANT/PROJECT:QUESTIONS.jsonl")
    parser.add_argument("--only", action="append", default=[], help="run only the default sets of this name")
    parser.add_argument("--fresh", action="store_true", help="run the tools again instead of the cached evidence")
    parser.add_argument("--json", help="write every question's row here")
    parser.add_argument("--show", choices=["declined", "answered", "all", "wrong"], help="print these questions")
    args = parser.parse_args()

    import django

    django.setup()
    specs = args.sets or default_sets()
    if args.only:
        specs = [s for s in specs if s.split("=", 1)[0] in args.only]
    rows: list[dict] = []
    print(
        f"{'set':28} {'n(u/a)':>7} {'unans_decl':>10} {'ans_decl':>9} {'fact_rec':>8} {'facts½':>7} {'cited_gold':>10}"
    )
    for spec in specs:
        set_rows = replay(spec, fresh=args.fresh)
        rows += set_rows
        s = summary(set_rows)
        print(
            f"{spec.split('=', 1)[0]:28} {s['n']:>7} {s['unans_declined']!s:>10} {s['ans_declined']!s:>9} "
            f"{s['fact_recall']!s:>8} {s['facts_half_all']!s:>7} {s['cited_gold']!s:>10}",
            flush=True,
        )
    s = summary(rows)
    print(
        f"{'ALL':28} {s['n']:>7} {s['unans_declined']!s:>10} {s['ans_declined']!s:>9} "
        f"{s['fact_recall']!s:>8} {s['facts_half_all']!s:>7} {s['cited_gold']!s:>10}"
    )
    if args.show:
        for r in rows:
            wrong = r["declined"] != r["unanswerable"]
            if (
                args.show == "all"
                or (args.show == "declined" and r["declined"])
                or (args.show == "answered" and not r["declined"])
                or (args.show == "wrong" and wrong)
            ):
                label = "UNANS" if r["unanswerable"] else "ANS"
                print(f"\n== {r['set']} {r['id']} [{label}] {r['status']} p={r['probability']} missing={r['missing']}")
                print("Q:", r["question"])
                print("A:", r["answer"][:800])
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
