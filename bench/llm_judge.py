"""What the gate's LLM sufficiency judgement adds, by what it is shown of each evidence block.

For each labelled question of each set: the rule planner's tools run, the gate's evidence model
decides (no LLM), and for each question the model lets through the configured LLM is asked the
gate's yes/no question twice, shown (a) each block's opening ``JUDGE_BLOCK_CHARS`` characters,
(b) each block's opening and its answering passages (``search.pipeline.gate.judge_block_text``,
what the gate sends). Prints, per set, how many unanswerable and answerable questions each view
makes the judge decline, and the judge's latency (p50 / p95, seconds).

Usage (after ``manage.py kb_eval --set fastapi`` and ``--set erb`` indexed their tenants; with
``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``KB_LLM_MODEL`` set, e.g. the local LLM of
``../shared/tools/local-llm/serve.sh``):

    .venv/bin/python bench/llm_judge.py --set NAME=TENANT/PROJECT:QUESTIONS.jsonl [...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kbportal.settings")


def collect(spec: str) -> list[dict]:
    from answerability_calibrate import parse_set

    from search.evaluation import load_questions
    from search.llm import without_llm
    from search.pipeline.executor import execute_plan
    from search.pipeline.gate import (
        ANSWERED_PROBABILITY,
        NOT_FOUND,
        answerability_features,
        answered_probability,
        llm_sufficiency,
        score_question_evidence,
    )
    from search.pipeline.planner import rule_plan

    name, scope, path = parse_set(spec)
    rows = []
    for q in load_questions(path):
        with without_llm():
            evidence = execute_plan(rule_plan(q.text), scope).evidence
        row = {"set": name, "id": q.id, "unanswerable": q.type == "unanswerable", "model": False}
        if any(ev.is_relevant for ev in evidence):
            scored = score_question_evidence(q.text, evidence, scope)
            row["model"] = answered_probability(answerability_features(scored, evidence)) >= ANSWERED_PROBABILITY
            if row["model"]:
                for view, arg in (("opening", None), ("passages", scored)):
                    t0 = time.perf_counter()
                    judged = llm_sufficiency(q.text, evidence, arg)
                    row[view] = None if judged is None else judged == NOT_FOUND
                    row[f"{view}_s"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
        print(f"  {name} {q.id}: {row}", file=sys.stderr, flush=True)
    return rows


def report(rows: list[dict]) -> None:
    from search.evaluation import percentile

    print("| set | kind | n | model declines | + judge (opening) | + judge (passages) |")
    print("|---|---|---:|---:|---:|---:|")
    for name in dict.fromkeys(r["set"] for r in rows):
        for kind, unans in (("unanswerable", True), ("answerable", False)):
            rs = [r for r in rows if r["set"] == name and r["unanswerable"] == unans]
            if not rs:
                continue
            model = sum(not r["model"] for r in rs)
            cells = [f"{model}"]
            for view in ("opening", "passages"):
                cells.append(f"{model + sum(bool(r.get(view)) for r in rs)}")
            print(f"| {name} | {kind} | {len(rs)} | " + " | ".join(cells) + " |")
    for view in ("opening", "passages"):
        times = sorted(r[f"{view}_s"] for r in rows if f"{view}_s" in r)
        failed = sum(1 for r in rows if r.get("model") and r.get(view) is None)
        if times:
            print(
                f"judge ({view}): p50 {percentile(times, 50):.1f} s, p95 {percentile(times, 95):.1f} s, "
                f"{failed} failed (the model's decision stood)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", dest="sets", required=True, help="NAME=TENANT/PROJECT:FILE")
    parser.add_argument("--json", type=Path, help="write the per-question rows here")
    args = parser.parse_args()
    import django

    django.setup()
    rows = [row for spec in args.sets for row in collect(spec)]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    report(rows)


if __name__ == "__main__":
    main()
