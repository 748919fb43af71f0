"""Embedding throughput per runtime, and ingestion rows/s per connector, side by side in one run.

Usage (after ``manage.py kb_eval --set fastapi``, whose indexed rows are the embedding sample;
``../shared`` beside the project for the connector inputs):

    .venv/bin/python bench/ingest_throughput.py [--chunks 1024] [--runtimes onnx,onnx-int8,sentence-transformers]
        [--connectors git,docs,jsonl,slack_export] [--skip-connectors]

**Embedding**: ``--chunks`` rows of the ``eval-fastapi`` tenant (code, doc sections and commits,
every n-th row by id so all three kinds are in), embedded in calls of 64 (what an ingestion flush
passes) by each runtime, interleaved call by call so a busy machine slows all alike. Prints
chunks/s, the cosine of each runtime's vectors to torch's (mean and min), single-query latency
(p50/p95 ms over the shared FastAPI questions, one at a time, as a search embeds its query), and
how often the top-1 neighbour among the sample matches torch's for those questions.

**Connectors**: each connector ingests a fixed input through ``manage.py ingest`` in a child
process with ``KB_EMBEDDING_BACKEND`` set to each runtime, into new data sources of the tenant
``bench-throughput`` (replaced on every run, so every row is embedded): ``git`` the FastAPI
package source (kb_eval's checkout), ``docs`` the FastAPI tutorial pages, ``jsonl`` the first 600
FastAPI commits, ``slack_export`` the Houston export. Prints rows, rows embedded, seconds and rows/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kbportal.settings")
SHARED = ROOT.parent / "shared"
TENANT = "bench-throughput"
CALL = 64  # rows per embed() call, as sources.services.ingestion.BATCH_SIZE


def _runtime(name: str):
    from sources.embeddings import OnnxEmbedder, SentenceTransformerEmbedder

    if name == "sentence-transformers":
        return SentenceTransformerEmbedder()
    if name in ("onnx", "onnx-int8"):
        return OnnxEmbedder(precision="int8" if name == "onnx-int8" else "fp32")
    raise SystemExit(f"unknown runtime {name!r}; use onnx, onnx-int8 or sentence-transformers")


def _sample(n: int) -> list[str]:
    from kbportal.tenancy import tenant_context
    from projects.models import Tenant
    from sources.models import Document

    tenant = Tenant.objects.filter(slug="eval-fastapi").first()
    if tenant is None:
        raise SystemExit("no eval-fastapi tenant: run `manage.py kb_eval --set fastapi` first")
    with tenant_context(tenant.pk):
        ids = list(Document.objects.order_by("id").values_list("id", flat=True))
        step = max(1, len(ids) // n)
        chosen = ids[::step][:n]
        return list(Document.objects.filter(id__in=chosen).order_by("id").values_list("text", flat=True))


def embedding_table(runtimes: list[str], n_chunks: int) -> None:
    import numpy as np

    texts = _sample(n_chunks)
    questions = [
        json.loads(line)["question"]
        for line in (SHARED / "eval/fastapi/questions.jsonl").read_text().splitlines()
        if line.strip()
    ] or ["How do I declare a dependency that runs after the response?"]
    names = ["sentence-transformers", *[r for r in runtimes if r != "sentence-transformers"]]
    models = {name: _runtime(name) for name in names}
    for model in models.values():  # warm up: first calls allocate
        model.embed(texts[:CALL])
        model.embed_query(questions[0])
    seconds = dict.fromkeys(names, 0.0)
    vectors: dict[str, list[list[float]]] = {name: [] for name in names}
    for start in range(0, len(texts), CALL):
        batch = texts[start : start + CALL]
        for name, model in models.items():
            t0 = time.perf_counter()
            vectors[name] += model.embed(batch)
            seconds[name] += time.perf_counter() - t0
    latency: dict[str, list[float]] = {name: [] for name in names}
    query_vectors: dict[str, list[list[float]]] = {name: [] for name in names}
    for q in questions:
        for name, model in models.items():
            t0 = time.perf_counter()
            query_vectors[name].append(model.embed_query(q))
            latency[name].append((time.perf_counter() - t0) * 1000)
    base = np.array(vectors["sentence-transformers"])
    base_top = (np.array(query_vectors["sentence-transformers"]) @ base.T).argmax(axis=1)
    print(f"\nembedding {len(texts)} rows of eval-fastapi in calls of {CALL}; {len(questions)} single queries\n")
    print(
        f"{'runtime':<22} {'chunks/s':>8} {'speed-up':>8} {'cos mean':>9} {'cos min':>9} "
        f"{'q p50 ms':>8} {'q p95 ms':>8} {'top-1 same':>10}"
    )
    for name in names:
        mine = np.array(vectors[name])
        cos = (mine * base).sum(axis=1)
        top = (np.array(query_vectors[name]) @ mine.T).argmax(axis=1)
        lat = sorted(latency[name])
        print(
            f"{name:<22} {len(texts) / seconds[name]:>8.1f} {seconds['sentence-transformers'] / seconds[name]:>7.2f}x "
            f"{cos.mean():>9.7f} {cos.min():>9.7f} "
            f"{statistics.median(lat):>8.1f} {lat[int(0.95 * (len(lat) - 1))]:>8.1f} "
            f"{int((top == base_top).sum()):>6}/{len(questions)}"
        )


def _inputs(workdir: Path) -> dict[str, tuple[str, dict, list[str]]]:
    from search.evaluation import fastapi_source_checkout

    commits = workdir / "commits.jsonl"
    with (SHARED / "corpora/fastapi-commits.jsonl").open() as src, commits.open("w") as out:
        for i, line in enumerate(src):
            if i >= 600:
                break
            out.write(line)
    return {
        "git": ("git", {"path": str(fastapi_source_checkout()), "max_commits": 0}, ["fastapi/*"]),
        "docs": ("docs", {"path": str(SHARED / "corpora/fastapi-docs"), "glob": ["docs/en/docs/tutorial/*.md"]}, []),
        "jsonl": (
            "jsonl",
            {
                "path": str(commits),
                "id_field": "sha",
                "kind": "commit",
                "title_field": "subject",
                "content_fields": ["body"],
            },
            [],
        ),
        "slack_export": ("slack_export", {"path": str(SHARED / "corpora/slack-export-houston")}, []),
    }


def connector_table(runtimes: list[str], connectors: list[str]) -> None:
    from django.core.management import call_command

    from kbportal.tenancy import tenant_context
    from projects.services import tenant_onboard
    from sources.models import DataSource, IngestionRun
    from sources.services import source_create

    call_command("migrate", verbosity=0)
    tenant_id = tenant_onboard(
        name="Bench throughput",
        slug=TENANT,
        admin_username="bench-throughput-admin",
        admin_password=os.urandom(12).hex(),
    ).tenant.pk
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        inputs = _inputs(Path(tmp))
        for connector in connectors:
            kind, config, include = inputs[connector]
            for runtime in runtimes:
                slug = f"tp-{connector}-{runtime}".replace("_", "-")
                with tenant_context(tenant_id):
                    DataSource.objects.filter(slug=slug).delete()
                source = source_create(
                    tenant_id=tenant_id, kind=kind, name=slug, slug=slug, config=config, include=include or None
                )
                env = {**os.environ, "KB_EMBEDDING_BACKEND": runtime}
                started = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, "manage.py", "ingest", f"{TENANT}/{slug}", "--quiet"],
                    cwd=ROOT,
                    env=env,
                    capture_output=True,
                    text=True,
                )
                seconds = time.perf_counter() - started
                if done.returncode != 0:
                    raise SystemExit(f"ingesting {slug} failed ({done.returncode}):\n{done.stderr[-2000:]}")
                with tenant_context(tenant_id):
                    run = IngestionRun.objects.filter(source_id=source.pk).order_by("-id").first()
                assert run is not None
                results.append((connector, runtime, run.seen, run.embedded, seconds))
                print(f"  {connector} / {runtime}: {run.seen} rows in {seconds:.1f}s", flush=True)
    print(f"\n{'connector':<13} {'runtime':<22} {'rows':>5} {'embedded':>8} {'seconds':>7} {'rows/s':>7}")
    for connector, runtime, rows, embedded, seconds in results:
        print(f"{connector:<13} {runtime:<22} {rows:>5} {embedded:>8} {seconds:>7.1f} {rows / seconds:>7.1f}")
    print("(seconds: the whole `manage.py ingest` child, start-up and model load included)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=1024)
    parser.add_argument("--runtimes", default="onnx,onnx-int8,sentence-transformers")
    parser.add_argument("--connectors", default="git,docs,jsonl,slack_export")
    parser.add_argument("--skip-connectors", action="store_true")
    parser.add_argument("--skip-embedding", action="store_true")
    args = parser.parse_args()
    import django

    django.setup()
    runtimes = [r for r in args.runtimes.split(",") if r]
    if not args.skip_embedding:
        embedding_table(runtimes, args.chunks)
    if not args.skip_connectors:
        connector_table(runtimes, [c for c in args.connectors.split(",") if c])


if __name__ == "__main__":
    main()
