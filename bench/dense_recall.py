"""How closely the dense ranker's HNSW index agrees with an exact scan, on real questions.

Usage (after ``manage.py kb_eval --set fastapi`` and ``--set erb`` indexed their tenants):

    .venv/bin/python bench/dense_recall.py [--set NAME=TENANT/PROJECT:QUESTIONS.jsonl ...] [--k 10]

For each question of each set, the question's embedding is ranked twice over the rows the
project may read: by ``search.retrieval.dense_ranking`` (pgvector's HNSW index, iterative scan,
as retrieval runs it) and by an exact scan (the same query with index scans off). Prints per
set: questions, ANN recall@k (the share of the exact top k the index returns in its top k,
averaged), and how many questions got a worse best match than the exact one (cosine lower by
more than 0.01). Identical vectors trap an HNSW search (``Document.embedding_duplicate``); this
is the measure that shows it.

Default sets: the development and test questions of ``bench/answerability/`` for FastAPI and ERB.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kbportal.settings")
BENCH = ROOT / "bench/answerability"
DEFAULT_SETS = [
    *(f"{p.stem}=eval-fastapi/fastapi:{p}" for p in sorted(BENCH.glob("fastapi_*.jsonl"))),
    *(f"{p.stem}=eval-erb/erb:{p}" for p in sorted(BENCH.glob("erb_*.jsonl"))),
]
WORSE_BY = 0.01


def exact_ranking(vector: list[float], scope, limit: int) -> list[tuple[int, float]]:
    """``dense_ranking``'s query as an exact scan (index scans off), in the caller's transaction."""
    from django.db import connection

    from search.retrieval.rankers import scope_where_sql

    where, params = scope_where_sql(scope, None)
    params.update(vec="[" + ",".join(f"{x:.7f}" for x in vector) + "]", limit=limit)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_indexscan = off")
        cursor.execute(
            f"""
            SELECT d.id, 1 - (d.embedding <=> %(vec)s::vector) FROM sources_document d
            WHERE d.embedding IS NOT NULL AND NOT d.embedding_duplicate AND {where}
            ORDER BY d.embedding <=> %(vec)s::vector LIMIT %(limit)s
            """,
            params,
        )
        rows = [(int(i), float(s)) for i, s in cursor.fetchall()]
        cursor.execute("SET LOCAL enable_indexscan = on")
    return rows


def measure(spec: str, k: int) -> tuple[str, int, float, int]:
    from django.db import transaction

    from kbportal.tenancy import tenant_context
    from search.evaluation import load_questions
    from search.retrieval import dense_ranking
    from sources.embeddings import get_embedder
    from sources.selectors import scope_for_operator

    name, rest = spec.split("=", 1)
    where, path = rest.split(":", 1)
    tenant, project = where.split("/", 1)
    scope = scope_for_operator(tenant_slug=tenant, project_slug=project)
    embedder = get_embedder()
    recalls, worse = [], 0
    questions = load_questions(Path(path))
    for q in questions:
        vector = embedder.embed_query(q.text)
        with transaction.atomic(), tenant_context(scope.tenant_id, user_id=scope.user_id):
            approximate = dense_ranking(vector, scope, limit=k)
            exact = exact_ranking(vector, scope, k)
        if not exact:
            continue
        recalls.append(len({i for i, _ in approximate} & {i for i, _ in exact}) / len(exact))
        worse += not approximate or approximate[0][1] < exact[0][1] - WORSE_BY
    return name, len(questions), sum(recalls) / len(recalls) if recalls else 0.0, worse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", dest="sets", help="NAME=TENANT/PROJECT:QUESTIONS.jsonl")
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    import django

    django.setup()
    print(f"{'set':<28}{'questions':>10}{f'ANN recall@{args.k}':>16}{'worse top-1':>13}")
    for spec in args.sets or DEFAULT_SETS:
        name, n, recall, worse = measure(spec, args.k)
        print(f"{name:<28}{n:>10}{recall:>16.3f}{worse:>13}")


if __name__ == "__main__":
    main()
