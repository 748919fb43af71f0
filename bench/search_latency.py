"""Search latency at scale: synthetic rows (384-dim embeddings) in one tenant among several.

Usage:

    .venv/bin/python bench/search_latency.py [--sizes 10000,100000] [--queries 100] [--keep]

For each size N it (re)creates the database ``kbportal_bench`` in the embedded server,
migrates it, loads N rows into tenant ``bench-target`` and N/4 rows into each of two other
tenants (so the filters matter), builds the HNSW index and times it, then runs ``--queries``
searches through the production path (``search.retrieval.hybrid_search``: query embedding,
lexical, dense, symbol rankers, RRF, merge) as the app role under row-level security. Prints a
table: rows in the target tenant, load seconds, HNSW build seconds, table + index size (MB),
search p50/p95 (ms), and the benchmark process's peak RSS (MB).

Synthetic data: embeddings are unit vectors around 1 centre per 50 rows (Gaussian noise,
sigma 0.35 per dimension before normalising), text is 40-80 words drawn from a Zipf(1.2)
vocabulary of 20,000 made-up words; queries are 3-6 vocabulary words. Rows are loaded with COPY
through the owner connection (bulk load), searched through the app role.
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kbportal.settings")
os.environ["KB_DATABASE_NAME"] = "kbportal_bench"

DIM = 384


def _vocabulary(rng, size: int = 20_000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = set()
    while len(words) < size:
        n = int(rng.integers(4, 10))
        words.add("".join(letters[i] for i in rng.integers(0, 26, n)))
    return sorted(words)


def _load(conn, *, tenant_id: int, source_id: int, n: int, rng, vocab: list[str], prefix: str) -> None:
    import numpy as np

    centres = rng.normal(size=(max(1, n // 50), DIM)).astype(np.float32)
    zipf = rng.zipf(1.2, size=n * 80) % len(vocab)
    batch = 5_000
    pos = 0
    for start in range(0, n, batch):
        rows = min(batch, n - start)
        vecs = centres[rng.integers(0, len(centres), rows)] + rng.normal(scale=0.35, size=(rows, DIM))
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        buf = io.StringIO()
        for i in range(rows):
            length = int(rng.integers(40, 81))
            words = [vocab[w] for w in zipf[pos : pos + length]]
            pos = (pos + length) % (len(zipf) - 100)
            text = " ".join(words)
            ext = f"{prefix}-{start + i}"
            vec = "[" + ",".join(f"{x:.5f}" for x in vecs[i]) + "]"
            buf.write(
                "\t".join(
                    [
                        str(tenant_id),
                        str(source_id),
                        "doc_section",
                        ext,
                        "",
                        words[0],
                        "",
                        f"{ext}.md",
                        "0",
                        text,
                        text,
                        "",
                        vec,
                        "{}",
                        "[]",
                        ext,
                        "1",
                        "2026-01-01 00:00:00+00",
                    ]
                )
                + "\n"
            )
        buf.seek(0)
        with conn.cursor() as cur:
            with cur.copy(
                "COPY sources_document (tenant_id, source_id, kind, external_id, parent_external_id, title, url,"
                " path, position, content, text, search_terms, embedding, metadata, principals, content_hash,"
                " generation, indexed_at) FROM STDIN"
            ) as copy:
                copy.write(buf.read())


def load_tenants(owner, n: int, *, rng, vocab: list[str]) -> list[tuple[int, int]]:
    """Tenant ``bench-target`` with ``n`` rows and two others with ``n // 4`` each, one synthetic
    source apiece, loaded by COPY through ``owner`` (HNSW index dropped: build it afterwards).
    Returns ``[(tenant id, source id)]``, the target first. Needs Django set up on the bench DB."""
    from projects.models import Tenant
    from projects.services import project_create
    from sources.services import source_create

    sources = []
    for slug, count in (("bench-target", n), ("bench-other-1", n // 4), ("bench-other-2", n // 4)):
        tenant = Tenant.objects.create(name=slug, slug=slug)
        project = project_create(tenant_id=tenant.pk, name="Everything")
        source = source_create(
            tenant_id=tenant.pk,
            kind="docs",
            name="Synthetic",
            config={"path": "/nonexistent"},
            project_ids=[project.pk],
        )
        owner.execute("DROP INDEX IF EXISTS document_embedding_hnsw")
        _load(owner, tenant_id=tenant.pk, source_id=source.pk, n=count, rng=rng, vocab=vocab, prefix=slug)
        owner.commit()
        sources.append((tenant.pk, source.pk))
    return sources


def run(sizes: list[int], n_queries: int, keep: bool) -> None:
    import numpy as np
    import psycopg

    from kbportal.db import ensure_embedded_database

    pgdata = Path(os.environ.get("KB_PGDATA", ROOT / ".pgdata"))  # the server settings use
    socket_dir, port = ensure_embedded_database(pgdata.resolve(), "kbportal")
    results = []
    for n in sizes:
        admin = psycopg.connect(dbname="postgres", user="postgres", host=socket_dir, port=port, autocommit=True)
        admin.execute("DROP DATABASE IF EXISTS kbportal_bench WITH (FORCE)")
        admin.execute("CREATE DATABASE kbportal_bench")
        admin.execute("GRANT CONNECT, TEMPORARY ON DATABASE kbportal_bench TO kbportal_app")
        admin.close()

        import django
        from django.core.management import call_command

        if not getattr(run, "_setup", False):
            django.setup()
            run._setup = True
        from django.db import connections

        connections.close_all()
        call_command("migrate", verbosity=0)
        from kbportal.tenancy import tenant_context
        from search.retrieval import hybrid_search
        from sources.selectors import scope_for_operator
        from sources.services import source_refresh_term_stats

        rng = np.random.default_rng(42)
        vocab = _vocabulary(rng)
        owner = psycopg.connect(dbname="kbportal_bench", user="postgres", host=socket_dir, port=port)

        t0 = time.perf_counter()
        sources = load_tenants(owner, n, rng=rng, vocab=vocab)
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        owner.execute("SET maintenance_work_mem = '4GB'")
        owner.execute(
            "CREATE INDEX document_embedding_hnsw ON sources_document USING hnsw (embedding vector_cosine_ops) "
            "WITH (m = 16, ef_construction = 64)"
        )
        owner.commit()
        build_s = time.perf_counter() - t0
        owner.execute("ANALYZE sources_document")
        owner.commit()
        t0 = time.perf_counter()
        for tenant_id, source_id in sources:  # what every ingestion run ends with
            with tenant_context(tenant_id):
                source_refresh_term_stats(source_id)
        stats_s = time.perf_counter() - t0
        size_mb = owner.execute("SELECT pg_total_relation_size('sources_document')").fetchone()[0] / 2**20

        scope = scope_for_operator(tenant_slug="bench-target", project_slug="everything")
        qrng = np.random.default_rng(7)
        queries = [
            " ".join(vocab[int(i)] for i in qrng.zipf(1.3, size=int(qrng.integers(3, 7))) % len(vocab))
            for _ in range(n_queries)
        ]
        hybrid_search(queries[0], scope)  # warm-up: model load, caches
        latencies = []
        stage_ms: dict[str, list[float]] = {}
        for q in queries:
            t = time.perf_counter()
            result = hybrid_search(q, scope)
            hits = result.hits
            latencies.append((time.perf_counter() - t) * 1000)
            for key, ms in result.timings_ms.items():
                stage_ms.setdefault(key, []).append(ms)
            assert all(h.source_id in scope.allowed_source_ids for h in hits)
        latencies.sort()
        p95 = latencies[min(len(latencies) - 1, int(round(0.95 * (len(latencies) - 1))))]
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        results.append((n, load_s, build_s, size_mb, statistics.median(latencies), p95, rss_mb))
        owner.close()
        connections.close_all()
        print(
            f"{n:>9} rows: load {load_s:.1f}s, HNSW build {build_s:.1f}s, term stats {stats_s:.1f}s, {size_mb:.0f} MB, "
            f"p50 {statistics.median(latencies):.1f} ms, p95 {p95:.1f} ms; median per stage: "
            + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in stage_ms.items()),
            flush=True,
        )
    if not keep:
        admin = psycopg.connect(dbname="postgres", user="postgres", host=socket_dir, port=port, autocommit=True)
        admin.execute("DROP DATABASE IF EXISTS kbportal_bench WITH (FORCE)")
        admin.close()
    print(
        "\n| rows (target tenant) | load s | HNSW build s | table+indexes MB | search p50 ms | search p95 ms "
        "| peak RSS MB |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, load_s, build_s, size_mb, p50, p95, rss in results:
        print(f"| {n:,} | {load_s:.1f} | {build_s:.1f} | {size_mb:.0f} | {p50:.1f} | {p95:.1f} | {rss:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description="Search latency at 10k/100k/1M synthetic rows.")
    parser.add_argument("--sizes", default="10000,100000", help="comma-separated row counts for the target tenant")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--keep", action="store_true", help="keep the kbportal_bench database afterwards")
    args = parser.parse_args()
    run([int(x) for x in args.sizes.split(",")], args.queries, args.keep)


if __name__ == "__main__":
    main()
