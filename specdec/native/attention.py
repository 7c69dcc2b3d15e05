"""Batch-invariant attention for decoding (specdec/native/_attention.c), as a Hugging Face attention implementation.

Why: torch's attention kernels block their work by the number of query rows and keys, so a position's attention
output in a verify pass over m positions differs in the last bits from the same position's in a one-token step, and
the greedy identity of speculative decoding would rest on near-ties not flipping. The native kernel computes every
(head, query) output over exactly its own keys in an order fixed by the key count and head size, so those bits agree.

`use_invariant_attention(model)` makes a Hugging Face model run it for passes of up to INVARIANT_ROWS query rows
(decoding steps, verify passes, a hybrid draft's catch-up); longer passes (a prompt) run torch's SDPA, whose rows
are never compared with a step's: the baseline and the speculative loop run the same prompt pass.
"""

from __future__ import annotations

import torch
from torch import nn

try:
    from specdec.native import _attention
except ImportError:  # not built (no compiler at install time)
    _attention = None

NAME = "specdec_invariant"
# Rows of a pass that run on the order-fixed native kernels (attention here, the products in both engines): decoding
# steps, verify passes and catch-ups; a longer pass (a prompt) runs on torch's kernels.
INVARIANT_ROWS = 32
MAX_HEAD_DIM = 512  # the kernel's stack accumulator (specdec/native/_attention_kernels.h)
KV_DTYPES = (torch.float32, torch.bfloat16)


def available() -> bool:
    return _attention is not None and _attention.supported()


def _check(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, where: str) -> None:
    """Everything the native kernel relies on, checked before the call: a wrong tensor is an error, never a read
    out of bounds."""
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
            raise ValueError(f"{where}: {name} must be a 4-d tensor (batch, heads, positions, head_dim), got "
                             f"{getattr(tensor, 'shape', type(tensor).__name__)}")
        if tensor.device.type != "cpu":
            raise ValueError(f"{where}: {name} is on {tensor.device}; the native attention runs on the CPU")
        if tensor.stride(-1) != 1:
            raise ValueError(f"{where}: {name}'s head dimension must be contiguous (stride 1), got {tensor.stride()}")
        if any(size > 1 and stride < 1 for size, stride in zip(tensor.shape, tensor.stride())):
            raise ValueError(f"{where}: {name} has overlapping or negative strides {tensor.stride()}")
    if key.dtype not in KV_DTYPES or value.dtype != key.dtype:
        raise TypeError(f"{where}: keys and values must be one of {KV_DTYPES}, got {key.dtype} and {value.dtype}")
    if not query.is_floating_point():
        raise TypeError(f"{where}: query must be floating point, got {query.dtype}")
    batch, heads, rows, head_dim = query.shape
    if batch != 1 or key.shape[0] != 1 or value.shape[0] != 1:
        raise ValueError(f"{where}: the native attention decodes one sequence (batch 1), got batch {batch}")
    if key.shape != value.shape or key.shape[-1] != head_dim:
        raise ValueError(f"{where}: keys {tuple(key.shape)} and values {tuple(value.shape)} must match each other "
                         f"and the query's head size {head_dim}")
    kv_heads, length = key.shape[1], key.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{where}: {heads} query heads are not a multiple of {kv_heads} key/value heads")
    if length < rows:
        raise ValueError(f"{where}: {rows} query rows but only {length} keys (the queries are the last positions)")
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"{where}: head size {head_dim} exceeds the kernel's {MAX_HEAD_DIM}")


def causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float,
                     where: str = "attention") -> torch.Tensor:
    """softmax(scale * q kᵀ) v for query rows at the last positions of the keys, causal, grouped-query heads.

    query (1, heads, m, head_dim), key and value (1, kv_heads, L, head_dim) fp32 or bf16 -> (1, m, heads,
    head_dim) fp32, the layout Hugging Face's attention functions return."""
    if not available():
        raise RuntimeError("the native attention is not available here (specdec.native._attention not built, or a CPU "
                           "without AVX2 and FMA)")
    # the kernel reads the head dimension contiguously: a transposed product's output (weight_major) is copied
    query, key, value = (t if t.dim() != 4 or t.stride(-1) == 1 else t.contiguous() for t in (query, key, value))
    _check(query, key, value, where)
    _, heads, rows, head_dim = query.shape
    q = query.float()  # a copy only where it is not fp32 already; strides are passed as they are
    out = torch.empty(1, rows, heads, head_dim, dtype=torch.float32)
    _attention.attention(q.data_ptr(), q.stride(1), q.stride(2), key.data_ptr(), key.stride(1), key.stride(2),
                         value.data_ptr(), value.stride(1), value.stride(2), out.data_ptr(), out.stride(2),
                         out.stride(1), heads, key.shape[1], rows, key.shape[2], head_dim, float(scale),
                         torch.get_num_threads(), key.dtype == torch.bfloat16)
    return out


def invariant_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                attention_mask: torch.Tensor | None, scaling: float | None = None,
                                dropout: float = 0.0, **kwargs):
    """A Hugging Face attention function (AttentionInterface): the native kernel for a decoding-sized pass, SDPA
    for a prompt pass. Causal decoding only: no sliding window, no dropout, no soft-capping."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] > INVARIANT_ROWS:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    unsupported = [name for name in ("sliding_window", "softcap") if kwargs.get(name) is not None]
    if dropout or unsupported or not getattr(module, "is_causal", True):
        raise ValueError(f"the invariant attention runs causal decoding only; this layer asks for "
                         f"{unsupported or ('dropout' if dropout else 'non-causal attention')}")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = causal_attention(query, key, value, scale, where=type(module).__name__)
    return out.to(query.dtype), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, invariant_attention_forward)
    # prompt passes fall back to SDPA, which needs the mask SDPA would get (a catch-up after a cached prefix)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


def use_invariant_attention(model: nn.Module) -> nn.Module:
    """Make a Hugging Face model run the batch-invariant attention (in place); returns the model."""
    if not available():
        raise RuntimeError("the batch-invariant attention needs specdec.native._attention (built by the install where "
                           "a C compiler is there) on a CPU with AVX2 and FMA")
    _register()
    model.config._attn_implementation = NAME
    for sub in model.modules():  # sub-configs that were copied (text configs of composite models)
        config = getattr(sub, "config", None)
        if config is not None and config is not model.config:
            config._attn_implementation = NAME
    return model
