"""How close in meaning two different questions come: the basis of the verified-answer match threshold.

A verified answer is shown for a later question only when the two questions mean the same. This
measures, with the portal's embedder (all-MiniLM-L6-v2, cosine of normalised vectors), the
similarity of pairs of *different* questions from the labelled FastAPI sets
(``bench/answerability/fastapi*.jsonl``, the shared FastAPI questions, and the first turns of
``bench/dialogues/``), split by whether they share a gold document:

- ``other gold``: questions about different pages: a match here shows a wrong verified answer;
- ``same gold``: different questions answered by the same page: close, yet not always the same
  question.

Prints the percentiles of each and, for candidate thresholds, the share of pairs at or above it;
then the share the whole rule (``search.verified.same_question``: the threshold and the same
content words and negations) accepts; then pairs written to differ in one word that reverses
or narrows the question (negation, antonym, a changed or added qualifier), which an embedding
puts close together. ``search.verified.VERIFIED_MATCH_SIMILARITY`` is chosen above the largest
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


# Pairs that differ in one word that changes the question: a verified answer to the first must
# not be shown for the second. Written for this bench (general constructions, no dataset's text).
CONTRASTS = [
    ("How do I increase the request timeout?", "How do I decrease the request timeout?"),
    ("Is the VPN required when working from home?", "Is the VPN not required when working from home?"),
    ("How do I allow CORS for my frontend?", "How do I block CORS for my frontend?"),
    ("Which port does the API use in production?", "Which port does the API use in development?"),
    ("How do I enable response caching?", "How do I disable response caching?"),
    ("How do I deploy the billing service?", "How do I deploy the billing service to production?"),
    ("Can I upload files larger than 1 GB?", "Can't I upload files larger than 1 GB?"),
    ("How do I add a user to the admin group?", "How do I remove a user from the admin group?"),
]
REWORDINGS = [
    ("How do I deploy the billing service?", "how do I deploy the billing service"),
    ("Where is the on-call rotation documented?", "Where's the on-call rotation documented?"),
]


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def main() -> None:
    import django

    django.setup()
    import numpy as np

    from search.verified import same_question
    from sources.embeddings import get_embedder

    rows = load()
    vectors = np.array(get_embedder().embed([q for q, _ in rows]))
    similarity = vectors @ vectors.T
    same, other = [], []
    same_rule, other_rule = 0, 0
    for i, j in itertools.combinations(range(len(rows)), 2):
        value = float(similarity[i, j])
        if rows[i][1] & rows[j][1]:
            same.append(value)
            same_rule += same_question(rows[i][0], rows[j][0], value)
        else:
            other.append(value)
            other_rule += same_question(rows[i][0], rows[j][0], value)
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
    print(
        f"same_question (0.90 and the same words): same gold {same_rule} of {len(same)}, "
        f"other gold {other_rule} of {len(other)}"
    )
    embedder = get_embedder()
    print(f"{'pair':80} {'cosine':>7} {'same?':>6}")
    for label, pairs in (("contrast", CONTRASTS), ("rewording", REWORDINGS)):
        for a, b in pairs:
            va, vb = np.array(embedder.embed([a, b]))
            value = float(va @ vb)
            print(f"{label + ': ' + a[:35] + ' / ' + b[:35]:80} {value:>7.3f} {str(same_question(a, b, value)):>6}")


if __name__ == "__main__":
    main()
