"""The cost of row-level security on search latency: the same data and queries, RLS on vs off.

Usage:

    .venv/bin/python bench/rls_cost.py [--sizes 10000,100000] [--queries 100] [--rounds 3] [--keep]

For each size N it (re)creates the database ``kbportal_bench_rls`` in the embedded server (its
own, so it never clobbers ``bench/search_latency.py``'s ``kbportal_bench``), migrates it and
loads the synthetic rows of ``bench/search_latency.py`` (imported, not copied: N rows in tenant
``bench-target`` and N/4 in each of two other tenants, 384-dim embeddings around one centre per
50 rows, Zipf text), builds the HNSW index and the term statistics, then times the same
``--queries`` searches through the production path (``search.retrieval.hybrid_search``) in two
modes on the same scope (tenant, project, ``allowed_source_ids``):

- ``rls``: the app role ``kbportal_app`` (no ``BYPASSRLS``, not the owner): every table's
  policy ``tenant_id = current_setting('app.tenant_id')`` is evaluated, as in production;
- ``no_rls``: the same Django connection re-opened as the superuser ``postgres``, which bypasses
  row-level security (checked before timing: with no tenant set it counts every row, while the
  app role counts none). The queries' own ``tenant_id``/``source_id`` filters stay, so the
  difference is the policy alone.

The modes alternate in ``--rounds`` rounds (each after 3 warm-up queries) so load drifts on a
shared machine hit both alike; the 1-minute load average is printed before and after. Prints a
table per size: p50/p95 of the whole search (ms) and the median of each stage
(``timings_ms``: embed, lexical, dense, ...), and the p50 difference (ms and %).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import search_latency  # noqa: E402  (sets DJANGO_SETTINGS_MODULE; its data generation is reused)

BENCH_DB = "kbportal_bench_rls"
os.environ["KB_DATABASE_NAME"] = BENCH_DB  # after the import: search_latency names its own database
MODES = ("rls", "no_rls")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _use_role(mode: str, app: dict, owner: dict) -> None:
    """Re-open Django's default connection as the app role (``rls``) or the superuser (``no_rls``)."""
    from django.db import connections

    connections["default"].close()
    source = app if mode == "rls" else owner
    connections["default"].settings_dict.update({k: source[k] for k in ("USER", "PASSWORD", "HOST", "PORT")})


def _visible_without_tenant() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM sources_document")
        return cursor.fetchone()[0]


def _build(n: int, socket_dir: str, port: int):
    """Create and fill the bench database for ``n`` target rows; returns the vocabulary."""
    import numpy as np
    import psycopg
    from django.core.management import call_command
    from django.db import connections

    admin = psycopg.connect(dbname="postgres", user="postgres", host=socket_dir, port=port, autocommit=True)
    admin.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
    admin.execute(f"CREATE DATABASE {BENCH_DB}")
    admin.execute(f"GRANT CONNECT, TEMPORARY ON DATABASE {BENCH_DB} TO kbportal_app")
    admin.close()
    connections.close_all()
    call_command("migrate", verbosity=0)

    from kbportal.tenancy import tenant_context
    from sources.services import source_refresh_term_stats

    rng = np.random.default_rng(42)
    vocab = search_latency._vocabulary(rng)
    owner = psycopg.connect(dbname=BENCH_DB, user="postgres", host=socket_dir, port=port)
    t0 = time.perf_counter()
    sources = search_latency.load_tenants(owner, n, rng=rng, vocab=vocab)
    owner.execute("SET maintenance_work_mem = '1GB'")
    owner.execute(
        "CREATE INDEX document_embedding_hnsw ON sources_document USING hnsw (embedding vector_cosine_ops) "
        "WITH (m = 16, ef_construction = 64)"
    )
    owner.commit()
    owner.execute("ANALYZE sources_document")
    owner.commit()
    owner.close()
    for tenant_id, source_id in sources:
        with tenant_context(tenant_id):
            source_refresh_term_stats(source_id)
    print(f"{n:>9} rows: built in {time.perf_counter() - t0:.1f}s", flush=True)
    return vocab


def run(sizes: list[int], n_queries: int, rounds: int, keep: bool) -> None:
    import django
    import numpy as np
    import psycopg

    from kbportal.db import ensure_embedded_database

    pgdata = Path(os.environ.get("KB_PGDATA", ROOT / ".pgdata"))  # where the settings look too
    socket_dir, port = ensure_embedded_database(pgdata.resolve(), "kbportal")
    django.setup()
    from django.db import connections

    app = dict(connections["default"].settings_dict)
    owner = dict(connections["owner"].settings_dict)
    table = []
    for n in sizes:
        _use_role("rls", app, owner)
        vocab = _build(n, socket_dir, port)
        from search.retrieval import hybrid_search
        from sources.selectors import scope_for_operator

        _use_role("rls", app, owner)
        scope = scope_for_operator(tenant_slug="bench-target", project_slug="everything")
        qrng = np.random.default_rng(7)  # the queries of bench/search_latency.py
        queries = [
            " ".join(vocab[int(i)] for i in qrng.zipf(1.3, size=int(qrng.integers(3, 7))) % len(vocab))
            for _ in range(n_queries)
        ]
        visible = {}
        for mode in MODES:
            _use_role(mode, app, owner)
            visible[mode] = _visible_without_tenant()
        if visible["rls"] != 0 or visible["no_rls"] < n:
            raise SystemExit(f"the modes are not what they claim: rows seen with no tenant set {visible}")
        latencies: dict[str, list[float]] = {m: [] for m in MODES}
        db_ms: dict[str, list[float]] = {m: [] for m in MODES}  # the search minus the query embedding
        stages: dict[str, dict[str, list[float]]] = {m: {} for m in MODES}
        hit_ids: dict[str, list[list[int]]] = {m: [] for m in MODES}
        load_before = os.getloadavg()[0]
        for _ in range(rounds):
            for mode in MODES:
                _use_role(mode, app, owner)
                for q in queries[:3]:
                    hybrid_search(q, scope)  # warm-up: model, caches, plans
                ids = []
                for q in queries:
                    t = time.perf_counter()
                    result = hybrid_search(q, scope)
                    latencies[mode].append((time.perf_counter() - t) * 1000)
                    db_ms[mode].append(latencies[mode][-1] - result.timings_ms.get("embed", 0.0))
                    for key, ms in result.timings_ms.items():
                        stages[mode].setdefault(key, []).append(ms)
                    ids.append([h.document_id for h in result.hits])
                hit_ids[mode] = ids
        load_after = os.getloadavg()[0]
        same = sum(a == b for a, b in zip(hit_ids["rls"], hit_ids["no_rls"], strict=True))
        table.append((n, latencies, stages, load_before, load_after, same, db_ms))
        print(
            f"{n:>9} rows: {n_queries} queries x {rounds} rounds per mode; load {load_before:.2f} -> {load_after:.2f}; "
            f"same hits in both modes for {same}/{n_queries} queries",
            flush=True,
        )
        connections.close_all()
    _use_role("rls", app, owner)
    connections.close_all()
    if not keep:
        admin = psycopg.connect(dbname="postgres", user="postgres", host=socket_dir, port=port, autocommit=True)
        admin.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
        admin.close()

    stage_names = sorted({k for _, _, stages, *_ in table for m in MODES for k in stages[m]})
    header = "| rows (target) | mode | search p50 ms | search p95 ms | without embed p50 ms | without embed p95 ms | "
    print("\n" + header + " | ".join(f"{s} p50 ms" for s in stage_names) + " |")
    print("|---:|---|---:|---:|---:|---:|" + "---:|" * len(stage_names))
    for n, latencies, stages, *_, db_ms in table:
        for mode in MODES:
            per_stage = " | ".join(
                f"{statistics.median(stages[mode][s]):.1f}" if s in stages[mode] else "" for s in stage_names
            )
            p50, p95 = statistics.median(latencies[mode]), _percentile(latencies[mode], 0.95)
            d50, d95 = statistics.median(db_ms[mode]), _percentile(db_ms[mode], 0.95)
            print(f"| {n:,} | {mode} | {p50:.1f} | {p95:.1f} | {d50:.1f} | {d95:.1f} | {per_stage} |")
    print(
        "\n| rows (target) | RLS cost, search p50 | RLS cost, search p95 | RLS cost without embed p50 "
        "| RLS cost without embed p95 | load 1 min (before -> after) |"
    )
    print("|---:|---:|---:|---:|---:|---|")

    def diff(rls: list[float], off: list[float], q: float) -> str:
        a, b = _percentile(rls, q), _percentile(off, q)
        return f"{a - b:+.1f} ms ({100 * (a - b) / b:+.1f}%)"

    for n, latencies, _, load_before, load_after, _, db_ms in table:
        print(
            f"| {n:,} | {diff(latencies['rls'], latencies['no_rls'], 0.5)} "
            f"| {diff(latencies['rls'], latencies['no_rls'], 0.95)} | {diff(db_ms['rls'], db_ms['no_rls'], 0.5)} "
            f"| {diff(db_ms['rls'], db_ms['no_rls'], 0.95)} | {load_before:.2f} -> {load_after:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description="Search p50/p95 with row-level security enforced vs bypassed.")
    parser.add_argument("--sizes", default="10000", help="comma-separated row counts for the target tenant")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per mode")
    parser.add_argument("--keep", action="store_true", help="keep the kbportal_bench_rls database afterwards")
    args = parser.parse_args()
    run([int(x) for x in args.sizes.split(",")], args.queries, args.rounds, args.keep)


if __name__ == "__main__":
    main()
