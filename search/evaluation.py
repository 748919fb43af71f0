"""Retrieval evaluation: recall@k, MRR and nDCG@10 of the ``search`` tool on gold-labelled questions.

Question files follow ``shared/eval/README.md``:
- FastAPI set: ``{"id", "type", "question", "gold": [{"kind": "doc", "path"} |
  {"kind": "code", "path", "line"} | {"kind": "commit", "pr"}]}``;
- EnterpriseRAG-Bench set: ``{"question_id", "question_type", "question", "expected_doc_ids"}``
  (questions without gold documents are skipped for retrieval metrics).

Per question with G gold items and ranked hits h_1..h_n (after merging chunks to their source):
recall@k = |gold items matched by h_1..h_k| / G; reciprocal rank = 1 / rank of the first hit
matching any gold item (0 if none in the list); nDCG@10 with binary gains, each gold item
credited once (Järvelin and Kekäläinen, 2002). Reported as means per question type and overall.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import tarfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from search.retrieval import Hit, hybrid_search
from sources.selectors import QueryScope

KS = (1, 3, 10)
FASTAPI_VERSION = "0.141.1"
DJANGO_HAYSTACK_VERSION = "5.2.19"


@dataclass
class Question:
    id: str
    type: str
    text: str
    gold: list[dict[str, Any]]
    facts: list[str] = field(default_factory=list)  # ERB ``answer_facts``: what a good answer states


@dataclass
class QuestionResult:
    question: Question
    first_relevant_rank: int | None
    recall: dict[int, float]
    ndcg10: float
    latency_ms: float
    top: list[str] = field(default_factory=list)


class EvalInputError(ValueError):
    """The questions file is missing or malformed; the message names the file and line."""


def load_questions(path: Path) -> list[Question]:
    """Read a questions JSONL file in either set's format. Raises ``EvalInputError``."""
    if not path.exists():
        raise EvalInputError(f"questions file {path} does not exist")
    questions: list[Question] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalInputError(f"{path}:{lineno}: invalid JSON: {exc}") from exc
        if "gold" in raw:
            gold = raw["gold"]
        elif "expected_doc_ids" in raw:
            gold = [{"kind": "doc_id", "id": d} for d in raw.get("expected_doc_ids") or []]
        else:
            raise EvalInputError(f"{path}:{lineno}: needs 'gold' or 'expected_doc_ids'")
        text = raw.get("question")
        if not isinstance(text, str) or not text.strip():
            raise EvalInputError(f"{path}:{lineno}: 'question' must be a non-empty string")
        questions.append(
            Question(
                id=str(raw.get("id") or raw.get("question_id") or lineno),
                type=str(raw.get("type") or raw.get("question_type") or "all"),
                text=text,
                gold=gold,
                facts=[str(f) for f in raw.get("answer_facts") or [] if str(f).strip()],
            )
        )
    return questions


def gold_matches(gold: dict[str, Any], hit: Hit) -> bool:
    """True when ``hit`` satisfies one gold item (rules of ``shared/eval/README.md``)."""
    kind = gold.get("kind")
    if kind == "doc":
        return hit.path == gold["path"]
    if kind == "code":
        if hit.path != gold["path"] or hit.start_line is None or hit.end_line is None:
            return False
        if hit.kind == "code_file":
            return False  # a whole-file row would contain every line; only chunks count
        return hit.start_line <= int(gold["line"]) <= hit.end_line
    if kind == "commit":
        pr = hit.metadata.get("pr_number")
        return hit.kind in {"commit", "pr"} and pr is not None and int(pr) == int(gold["pr"])
    if kind == "doc_id":
        return hit.external_id == gold["id"]
    return False


def score_question(question: Question, hits: list[Hit], latency_ms: float) -> QuestionResult:
    """Rank-based metrics of one question's ranked hits."""
    golds: list[dict[str, Any]] = []
    for gold in question.gold:  # a gold item listed twice counts once
        if gold not in golds:
            golds.append(gold)
    found_at: dict[int, int] = {}
    first: int | None = None
    for rank, hit in enumerate(hits, start=1):
        # One hit credits at most one gold item, so nDCG stays <= 1.
        for gi, gold in enumerate(golds):
            if gi not in found_at and gold_matches(gold, hit):
                found_at[gi] = rank
                if first is None:
                    first = rank
                break
    n_gold = len(golds)
    recall = {k: sum(1 for r in found_at.values() if r <= k) / n_gold for k in KS}
    dcg = sum(1.0 / math.log2(r + 1) for r in found_at.values() if r <= 10)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(n_gold, 10)))
    return QuestionResult(
        question=question,
        first_relevant_rank=first,
        recall=recall,
        ndcg10=dcg / ideal if ideal else 0.0,
        latency_ms=latency_ms,
        top=[f"{h.kind}:{h.path or h.external_id}:{h.start_line or ''}" for h in hits[:3]],
    )


def evaluate(
    questions: list[Question], scope: QueryScope, *, rankers=None, limit: int = 10, rerank: bool = True
) -> dict[str, Any]:
    """Run every question with gold items through ``hybrid_search`` (as the ``search`` tool does:
    with ``rerank``, near-duplicates collapsed and the top 20 reranked); returns the report dict.

    ``report["by_type"][type]`` and ``report["overall"]`` hold n, recall@1/3/10, MRR, nDCG@10;
    ``report["latency_ms"]`` p50/p95 of search time; ``report["questions"]`` per-question rows.
    """
    results: list[QuestionResult] = []
    for q in questions:
        if not q.gold:
            continue
        t0 = time.perf_counter()
        if rankers:
            hits = hybrid_search(q.text, scope, limit=limit, rerank=rerank, rankers=tuple(rankers)).hits
        else:
            hits = hybrid_search(q.text, scope, limit=limit, rerank=rerank).hits
        results.append(score_question(q, hits, (time.perf_counter() - t0) * 1000))

    def summary(rows: list[QuestionResult]) -> dict[str, float]:
        return {
            "n": len(rows),
            **{f"recall@{k}": round(statistics.fmean(r.recall[k] for r in rows), 3) for k in KS},
            "mrr": round(statistics.fmean(1 / r.first_relevant_rank if r.first_relevant_rank else 0 for r in rows), 3),
            "ndcg@10": round(statistics.fmean(r.ndcg10 for r in rows), 3),
        }

    by_type: dict[str, list[QuestionResult]] = defaultdict(list)
    for r in results:
        by_type[r.question.type].append(r)
    latencies = sorted(r.latency_ms for r in results)
    return {
        "overall": summary(results) if results else {"n": 0},
        "by_type": {t: summary(rows) for t, rows in sorted(by_type.items())},
        "latency_ms": {
            "p50": round(percentile(latencies, 50), 1),
            "p95": round(percentile(latencies, 95), 1),
        }
        if latencies
        else {},
        "questions": [
            {
                "id": r.question.id,
                "type": r.question.type,
                "rank": r.first_relevant_rank,
                "recall@10": r.recall[10],
                "top": r.top,
            }
            for r in results
        ],
    }


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    index = (len(values) - 1) * pct / 100
    lo, hi = math.floor(index), math.ceil(index)
    return values[lo] + (values[hi] - values[lo]) * (index - lo)


def sdist_checkout(package: str, version: str, workdir: Path | None = None) -> Path:
    """The sdist of ``package==version``, downloaded from PyPI and unpacked as a git repository.

    Returns the repository root (the sdist's top folder, e.g. ``fastapi-0.141.1/``). Cached
    under ``KB_WORKDIR/<package>-src``; raises ``RuntimeError`` naming the command when the
    download fails.
    """
    root = Path(workdir or settings.KB_WORKDIR) / f"{package}-src"
    repo = root / f"{package}-{version}"
    if (repo / ".git").exists():
        return repo
    root.mkdir(parents=True, exist_ok=True)
    sdists = list(root.glob(f"{package}-{version}.tar.gz"))
    if not sdists:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"{package}=={version}",
            "-d",
            str(root),
            "-q",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        sdists = list(root.glob(f"{package}-{version}.tar.gz"))
        if proc.returncode != 0 or not sdists:
            raise RuntimeError(
                f"could not download the {package} sdist ({' '.join(cmd)}): {proc.stderr.strip()[-500:]}"
            )
    with tarfile.open(sdists[0]) as tar:
        tar.extractall(root, filter="data")
    git = ["git", "-c", "user.name=kbportal", "-c", "user.email=kbportal@localhost", "-C", str(repo)]
    subprocess.run(git[:-2] + ["init", "-q", str(repo)], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", f"{package} {version} sdist"], check=True)
    return repo


def fastapi_source_checkout(workdir: Path | None = None) -> Path:
    """The FastAPI 0.141.1 sdist as a git repository (:func:`sdist_checkout`), holding ``fastapi/``."""
    return sdist_checkout("fastapi", FASTAPI_VERSION, workdir)


def django_source_checkout(workdir: Path | None = None) -> Path:
    """The Django 5.2.19 sdist as a git repository (:func:`sdist_checkout`), holding ``django/``
    and ``docs/``: the unrelated material of the haystack evaluation (``shared/eval/README.md``)."""
    return sdist_checkout("django", DJANGO_HAYSTACK_VERSION, workdir)
