"""Ask latency over the first N questions of an evaluation set, with whatever LLM is configured.

Usage (after ``manage.py kb_eval --set fastapi`` has indexed the evaluation tenant):

    .venv/bin/python bench/ask_latency.py [--set fastapi] [--n 10]

Prints a table: per question the total, plan, tools and synthesis times in milliseconds, then
p50/p95 of the totals. The first question is run once beforehand to load the embedding model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kbportal.settings")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default="fastapi", choices=["fastapi", "erb"])
    parser.add_argument("--n", type=int, default=10)
    args = parser.parse_args()

    import django

    django.setup()
    from search.evaluation import percentile
    from search.services import ask
    from sources.selectors import scope_for_operator

    questions_file = ROOT.parent / "shared" / "eval" / args.set / "questions.jsonl"
    questions = [json.loads(line)["question"] for line in questions_file.read_text().splitlines() if line.strip()]
    questions = questions[: args.n]
    scope = scope_for_operator(tenant_slug=f"eval-{args.set}", project_slug=args.set)
    ask(questions[0], scope)  # warm-up: model load
    totals = []
    print(f"{'#':>3} {'total':>8} {'plan':>7} {'tools':>7} {'synth':>7}  answered  question")
    for i, question in enumerate(questions, start=1):
        result = ask(question, scope)
        t = result.timings_ms
        totals.append(t["total"])
        print(
            f"{i:>3} {t['total']:>8.0f} {t['plan']:>7.0f} {t['tools']:>7.0f} {t['synthesize']:>7.0f}  "
            f"{'yes' if result.answer.answered else 'no':<8}  {question[:60]}"
        )
    totals.sort()
    print(
        f"\nask latency over {len(totals)} questions (synthesizer: {result.answer.synthesizer}): "
        f"p50 {percentile(totals, 50):.0f} ms, p95 {percentile(totals, 95):.0f} ms, "
        f"mean {statistics.fmean(totals):.0f} ms"
    )


if __name__ == "__main__":
    main()
