"""Loading a prepared model directory (safetensors + tokenizer + manifest.json) as the decoding loops run it.

A prepared directory is what the study's models stage writes (`specdec.study.prepare.models`); `manifest.json` is
written last and marks it complete. Loading is safetensors only, no remote code, no network.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from specdec.errors import InvalidModelDirError, VocabularyMismatchError
from specdec.fp32.kernels import (
    apply_bf16_tables,
    available_backends,
    time_backends,
    tune_row_adaptive_bf16,
    use_backends,
    use_invariant_kernels,
    use_row_adaptive_bf16_linear,
)
from specdec.fp32.kernel_tables import fastest_backends
from specdec.runtime import Runtime

MANIFEST = "manifest.json"
DTYPES = ("float32", "bfloat16", "float16")


def torch_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return getattr(torch, dtype)


def read_manifest(model_dir: str | os.PathLike) -> dict:
    path = Path(model_dir) / MANIFEST
    if not path.is_file():
        raise InvalidModelDirError(f"{model_dir} has no {MANIFEST}: it is not a prepared model (or its preparation was "
                                   f"interrupted); run the models stage (prepare_model) first")
    return json.loads(path.read_text())


def load_model(model_dir: str | os.PathLike, dtype: str = "float32", device: str = "cpu"):
    """Load a prepared model (safetensors only, no remote code) and its tokenizer; the model is in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    read_manifest(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype(dtype), use_safetensors=True,
                                                 trust_remote_code=False, local_files_only=True)
    model.to(device).eval()
    tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False, local_files_only=True)
    return model, tok


def load_for_decoding(model_dir, runtime: Runtime, backend_tables: dict[str, dict[int, str]] | None = None,
                      log=lambda _: None):
    """A prepared model set up as the study runs it (dtype, device, linear kernel); returns (model, tokenizer).

    With linear_kernel "auto", `backend_tables` (kernel_tables.tables_from_timings over this machine's timings: fp32
    "out x in" -> {rows: backend}, or bf16 ones with "beyond") says which product each layer runs; without them the
    products are timed now. With "invariant" only a bf16 model's prompt-pass product comes from them."""
    if runtime.threads:
        torch.set_num_threads(runtime.threads)
    if runtime.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("runtime device is 'cuda' but torch sees no CUDA device")
    if runtime.weights != "safetensors":
        raise ValueError(f"load_for_decoding loads prepared safetensors directories; runtime weights "
                         f"{runtime.weights!r} load through specdec.gguf.loading.load_gguf_for_decoding")
    model, tokenizer = load_model(model_dir, dtype=runtime.dtype, device=runtime.device)
    return prepare_for_decoding(model, runtime, backend_tables, log), tokenizer


def prepare_for_decoding(model, runtime: Runtime, backend_tables: dict[str, dict[int, str]] | None = None,
                         log=lambda _: None):
    """A loaded model's linear layers and attention set up per runtime.linear_kernel (load_for_decoding's, also
    for a model of random weights that a profile times in place of weights the machine does not have)."""
    if runtime.device != "cpu" or runtime.linear_kernel == "default":
        return model
    if runtime.linear_kernel == "invariant":
        return use_invariant_kernels(model, backend_tables if runtime.dtype == "bfloat16" else None)
    if runtime.dtype == "bfloat16":
        # few rows read the bf16 weights (torch's product or the AVX2 kernel), many rows (a prompt pass) run on an
        # fp32 copy of the same values or torch's bf16 product; with "auto" as measured per shape and row count
        model = use_row_adaptive_bf16_linear(model, default="avx2-bf16" if runtime.linear_kernel == "avx2" else "bf16")
        if runtime.linear_kernel == "auto":
            if backend_tables:
                apply_bf16_tables(model, backend_tables)
            else:
                tune_row_adaptive_bf16(model, log=log)
        return model
    if runtime.linear_kernel == "auto":
        if backend_tables is None:
            backend_tables = fastest_backends(time_backends(model, log=log))
        return use_backends(model, "linear", backend_tables)
    if runtime.linear_kernel not in available_backends():
        raise RuntimeError(f"linear kernel {runtime.linear_kernel!r} is not available on this machine "
                           f"(available: {available_backends()}); use 'auto'")
    return use_backends(model, runtime.linear_kernel)


def check_same_vocabulary(tok_a, tok_b, name_a: str, name_b: str) -> None:
    """Raise VocabularyMismatchError unless both tokenizers map the same strings to the same ids."""
    va, vb = tok_a.get_vocab(), tok_b.get_vocab()
    if va == vb and len(tok_a) == len(tok_b):
        return
    only_a = sorted(set(va) - set(vb))[:5]
    only_b = sorted(set(vb) - set(va))[:5]
    moved = sorted(t for t in set(va) & set(vb) if va[t] != vb[t])[:5]
    raise VocabularyMismatchError(
        f"models {name_a!r} and {name_b!r} have different vocabularies ({len(tok_a)} vs {len(tok_b)} tokens; "
        f"only in {name_a}: {only_a}; only in {name_b}: {only_b}; different ids: {moved}); "
        f"speculative decoding needs a draft with the target's tokenizer")
