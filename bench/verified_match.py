"""How close in meaning two different questions come: the basis of the verified-answer match threshold.

A verified answer is shown for a later question only when the two questions mean the same. This
measures, with the portal's embedder (all-MiniLM-L6-v2, cosine of normalised vectors), the
similarity of pairs of *different* questions from the labelled FastAPI sets
(``bench/answerability/fastapi*.jsonl``, the shared FastAPI questions, and the first turns of
``bench/dialogues/``), split by whether they share a gold document:

- ``other gold``: questions about different pages: a match here shows a wrong verified answer;
- ``same gold``: different questions answered by the same page: close, yet not always the same
  question.

Prints the percentiles of each and, for candidate thresholds, the share of pairs at or above it.
No database needed. ``search.verified.VERIFIED_MATCH_SIMILARITY`` is chosen above the largest
``other gold`` similarity seen here.

    .venv/bin/python bench/verified_match.py
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kbportal.settings")
SHARED = ROOT.parent / "shared"


def gold_key(gold: dict) -> str:
    return f"{gold.get('kind')}:{gold.get('path') or gold.get('pr') or gold.get('id')}"


def load() -> list[tuple[str, frozenset[str]]]:
    questions: dict[str, frozenset[str]] = {}
    files = sorted((ROOT / "bench" / "answerability").glob("fastapi*.jsonl")) + [
        SHARED / "eval/fastapi/questions.jsonl"
    ]
    for path in files:
        if not path.exists() or "test3" in path.name or "test4" in path.name:  # blind sets stay unread
            continue
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                gold = frozenset(gold_key(g) for g in row.get("gold") or [])
                if gold:
                    questions[row["question"]] = gold
    for path in sorted((ROOT / "bench" / "dialogues").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                turn = json.loads(line)["turns"][0]
                questions[turn["question"]] = frozenset(gold_key(g) for g in turn["gold"])
    return list(questions.items())


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def main() -> None:
    import django

    django.setup()
    import numpy as np

    from sources.embeddings import get_embedder

    rows = load()
    vectors = np.array(get_embedder().embed([q for q, _ in rows]))
    similarity = vectors @ vectors.T
    same, other = [], []
    for i, j in itertools.combinations(range(len(rows)), 2):
        (same if rows[i][1] & rows[j][1] else other).append(float(similarity[i, j]))
    print(f"{len(rows)} questions, {len(same)} same-gold pairs, {len(other)} other-gold pairs")
    print(f"{'pairs':12} {'p50':>6} {'p95':>6} {'p99':>6} {'p99.9':>6} {'max':>6}")
    for label, values in (("same gold", same), ("other gold", other)):
        print(
            f"{label:12} {percentile(values, 50):>6.3f} {percentile(values, 95):>6.3f} {percentile(values, 99):>6.3f} "
            f"{percentile(values, 99.9):>6.3f} {max(values):>6.3f}"
        )
    print(f"{'threshold':>10} {'same gold >=':>13} {'other gold >=':>14}")
    for threshold in (0.75, 0.8, 0.85, 0.9, 0.92, 0.95):
        print(
            f"{threshold:>10.2f} {sum(v >= threshold for v in same) / len(same):>13.4f} "
            f"{sum(v >= threshold for v in other) / len(other):>14.5f}"
        )


if __name__ == "__main__":
    main()
