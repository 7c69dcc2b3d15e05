"""The lean forward's per-row operations on specdec/native/_rowops.c: RMSNorm and silu(gate) * up, one native call each,
every row computed on its own in one fixed order (batch-invariant), every call checked before it enters C."""

from __future__ import annotations

import torch

try:
    from specdec.native import _rowops
except ImportError:  # not built (no compiler at install time)
    _rowops = None


def available() -> bool:
    return _rowops is not None and _rowops.supported()


def _check_rows(name: str, tensor: torch.Tensor, width: int) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu" or tensor.dtype != torch.float32:
        raise ValueError(f"{name} must be a CPU float32 tensor, got "
                         f"{getattr(tensor, 'dtype', type(tensor).__name__)} on {getattr(tensor, 'device', '?')}")
    if tensor.dim() != 2 or tensor.shape[1] != width or tensor.stride(1) != 1:
        raise ValueError(f"{name} must be (rows, {width}) with contiguous rows, got {tuple(tensor.shape)} "
                         f"strides {tensor.stride()}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (rows, n) / sqrt(mean(x², row) + eps) * weight (n), fp32, rows computed alone."""
    if not available():
        raise RuntimeError("specdec.native._rowops is not available here (not built, or a CPU without AVX2/FMA/F16C)")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        raise ValueError(f"rms_norm weight must be a 1-d vector, got {tuple(getattr(weight, 'shape', ()))}")
    width = weight.shape[0]
    _check_rows("rms_norm weight", weight.reshape(1, -1), width)
    x = x.contiguous()
    _check_rows("rms_norm input", x, width)
    out = torch.empty_like(x)
    _rowops.rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], width, float(eps))
    return out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for two (rows, n) views that share a row stride (a gate|up product's halves)."""
    if not available():
        raise RuntimeError("specdec.native._rowops is not available here (not built, or a CPU without AVX2/FMA/F16C)")
    width = gate.shape[-1] if isinstance(gate, torch.Tensor) else -1
    _check_rows("silu_mul gate", gate, width)
    _check_rows("silu_mul up", up, width)
    if gate.shape != up.shape or gate.stride(0) != up.stride(0):
        raise ValueError(f"gate and up must have one shape and row stride, got {tuple(gate.shape)} {gate.stride()} "
                         f"and {tuple(up.shape)} {up.stride()}")
    out = torch.empty(gate.shape, dtype=torch.float32)
    _rowops.silu_mul(gate.data_ptr(), up.data_ptr(), gate.stride(0), out.data_ptr(), gate.shape[0], width)
    return out
