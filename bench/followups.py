"""Follow-up questions: does retrieval find the gold document with and without the rewrite?

Replays scripted dialogues (``bench/dialogues/*.jsonl``: ``{"id", "turns": [{"question",
"gold": [...], "leans_on_history": bool}]}``, gold items as in ``../shared/eval/README.md``)
over the FastAPI evaluation tenant. For every follow-up turn (each turn after the first), the
``search`` ranking (``hybrid_search``, reranked, top 10) is scored for

- ``as asked``: the follow-up alone, as the pipeline would read it without a conversation;
- ``rules``: ``search.pipeline.followup.rule_rewrite`` with the earlier turns;
- ``llm`` (with ``--llm``; needs ``OPENAI_BASE_URL`` and ``KB_LLM_MODEL``, e.g. the local
  server of ``../shared/tools/local-llm/serve.sh``): ``rewrite_followup`` with the LLM.

Each mode keeps its own history (its earlier rewrites), as a conversation would. The earlier
answers are not given to the LLM (no answer is generated here): a conservative reading of the
product, which passes them. Prints, per mode and for the turns that lean on history and those
that stand alone: found@10 (share of turns with a gold item in the top 10), MRR, and the
rewrite's p50/p95 milliseconds.

Usage (after ``manage.py kb_eval --set fastapi`` indexed the ``eval-fastapi`` tenant):

    .venv/bin/python bench/followups.py [--dialogues FILE ...] [--llm] [--show]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kbportal.settings")


def load_dialogues(path: Path) -> list[dict]:
    dialogues = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                dialogues.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SystemExit(f"{path}:{number}: not JSON ({exc})") from exc
    return dialogues


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def replay(dialogues: list[dict], scope, mode: str) -> list[dict]:
    from search.evaluation import Question, score_question
    from search.llm import without_llm
    from search.pipeline.followup import Rewrite, Turn, rewrite_followup, rule_rewrite
    from search.retrieval import hybrid_search

    rows = []
    for dialogue in dialogues:
        history: list[Turn] = []
        for index, turn in enumerate(dialogue["turns"]):
            asked = turn["question"]
            t0 = time.perf_counter()
            if index == 0 or mode == "as asked":
                rewrite = Rewrite(question=asked, standalone=asked)
            elif mode == "rules":
                rewrite = rule_rewrite(asked, history)
            else:
                rewrite = rewrite_followup(asked, history)
            rewrite_ms = (time.perf_counter() - t0) * 1000
            history.append(Turn(question=asked, standalone=rewrite.standalone))
            if index == 0:
                continue
            with without_llm():
                hits = hybrid_search(rewrite.standalone, scope, limit=10, rerank=True).hits
            scored = score_question(
                Question(id=dialogue["id"], type="followup", text=asked, gold=turn["gold"]), hits, 0
            )
            rows.append(
                {
                    "dialogue": dialogue["id"],
                    "turn": index + 1,
                    "leans": bool(turn.get("leans_on_history", True)),
                    "question": asked,
                    "standalone": rewrite.standalone,
                    "method": rewrite.method,
                    "error": rewrite.error,
                    "rank": scored.first_relevant_rank,
                    "rewrite_ms": rewrite_ms,
                }
            )
    return rows


def summary(rows: list[dict]) -> dict:
    if not rows:
        return {"n": 0, "found@10": "-", "mrr": "-"}
    return {
        "n": len(rows),
        "found@10": round(statistics.fmean(1.0 if r["rank"] else 0.0 for r in rows), 3),
        "mrr": round(statistics.fmean(1 / r["rank"] if r["rank"] else 0.0 for r in rows), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dialogues", action="append", type=Path, help="dialogue files (default: bench/dialogues/*)")
    parser.add_argument("--tenant", default="eval-fastapi")
    parser.add_argument("--project", default="fastapi")
    parser.add_argument("--llm", action="store_true", help="also the LLM rewrite (OPENAI_BASE_URL, KB_LLM_MODEL)")
    parser.add_argument("--show", action="store_true", help="print every follow-up with its rewrite and rank")
    args = parser.parse_args()

    import django

    django.setup()
    from search.llm import llm_configured
    from sources.selectors import scope_for_operator

    if args.llm and not llm_configured():
        raise SystemExit("--llm: set OPENAI_BASE_URL and KB_LLM_MODEL (see ../shared/tools/local-llm/serve.sh)")
    scope = scope_for_operator(tenant_slug=args.tenant, project_slug=args.project)
    files = args.dialogues or sorted((ROOT / "bench" / "dialogues").glob("*.jsonl"))
    modes = ["as asked", "rules"] + (["llm"] if args.llm else [])
    print(
        f"{'dialogues':18} {'mode':9} {'leaning n':>9} {'found@10':>8} {'MRR':>6} "
        f"{'standalone n':>12} {'found@10':>8} {'MRR':>6} {'rewrite p50/p95 ms':>19}"
    )
    for path in files:
        dialogues = load_dialogues(path)
        for mode in modes:
            rows = replay(dialogues, scope, mode)
            leaning = summary([r for r in rows if r["leans"]])
            alone = summary([r for r in rows if not r["leans"]])
            times = [r["rewrite_ms"] for r in rows]
            print(
                f"{path.stem:18} {mode:9} {leaning['n']:>9} {leaning['found@10']!s:>8} {leaning['mrr']!s:>6} "
                f"{alone['n']:>12} {alone['found@10']!s:>8} {alone['mrr']!s:>6} "
                f"{percentile(times, 50):>9.0f}/{percentile(times, 95):<9.0f}",
                flush=True,
            )
            if args.show:
                for r in rows:
                    mark = "lean" if r["leans"] else "alone"
                    print(f"   {r['dialogue']}.{r['turn']} [{mark}] rank={r['rank']} {r['question']!r}")
                    if r["standalone"] != r["question"]:
                        print(f"      -> {r['standalone']!r}{' (' + r['error'] + ')' if r['error'] else ''}")


if __name__ == "__main__":
    main()
