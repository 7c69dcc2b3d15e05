"""CPU fast paths for batch-1 decoding that keep the model's weights (same values, same dtype).

On the 2-core AMD machines of this project, torch's fp32 `F.linear` (MKL) is 2-4x slower for 2-9 input rows than
for one row, which makes a verify pass over k+1 positions cost several target steps. Computing the product as
W @ x^T instead (the weight as the left operand) runs 2-9 rows in about the time of one: see README, "Performance".
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn


class WeightMajorLinear(nn.Module):
    """nn.Linear computed as (W @ x^T)^T. Shares the original Parameters: no copy of the weights."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.bias is None:
            out = torch.mm(self.weight, rows.t()).t()
        else:
            out = torch.addmm(self.bias.unsqueeze(1), self.weight, rows.t()).t()
        return out.reshape(*x.shape[:-1], self.out_features)


class RowAdaptiveBf16Linear(nn.Module):
    """A bf16 linear layer that computes products of many rows with an fp32 copy of the same weight values.

    On a CPU without native bf16 arithmetic (this project's AMD machines: no AVX-512 BF16), a bf16 product of one
    row costs about a third of the fp32 one (half the bytes to read), but a product of many rows is compute-bound
    and emulated: a bf16 draft's prompt pass took 2.7x its fp32 time. Rows up to `max_bf16_rows` use the bf16
    weight; more rows use `weight.float()`, which holds exactly the same values, and the result is rounded back to
    bf16. Either way the layer is the bf16 model; only the accumulation differs, which no exactness argument relies
    on (a draft's q is whatever it computed)."""

    def __init__(self, linear: nn.Linear, max_bf16_rows: int = 8):
        super().__init__()
        if linear.weight.dtype != torch.bfloat16:
            raise TypeError(f"RowAdaptiveBf16Linear wraps a bfloat16 nn.Linear, got {linear.weight.dtype}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.max_bf16_rows = max_bf16_rows
        self.weight, self.bias = linear.weight, linear.bias
        # Not Parameters: kept out of state_dict and of parameter counts; 2x the bf16 weight's memory.
        self.weight_fp32 = linear.weight.detach().float()
        self.bias_fp32 = None if linear.bias is None else linear.bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows <= self.max_bf16_rows:
            return nn.functional.linear(x, self.weight, self.bias)
        return nn.functional.linear(x.float(), self.weight_fp32, self.bias_fp32).to(x.dtype)


def use_row_adaptive_bf16_linear(model: nn.Module, max_bf16_rows: int = 8) -> nn.Module:
    """Replace every bfloat16 nn.Linear of `model` in place (see RowAdaptiveBf16Linear); returns the model."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.bfloat16:
                replacement = RowAdaptiveBf16Linear(child, max_bf16_rows)
                replacement.original = [child]  # default_linear() swaps it back
                setattr(parent, name, replacement)
    return model


def use_weight_major_linear(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of `model` in place; returns the model."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                replacement = WeightMajorLinear(child)
                replacement.original = [child]  # in a list: not registered as a submodule
                setattr(parent, name, replacement)
    return model


@contextmanager
def default_linear(model: nn.Module):
    """Inside the block the model runs torch's own nn.Linear again (e.g. to time a library that uses it as shipped);
    the weight-major layers come back afterwards. Weights are shared throughout: nothing is copied."""
    swapped = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, (WeightMajorLinear, RowAdaptiveBf16Linear)) and hasattr(child, "original"):
                setattr(parent, name, child.original[0])
                swapped.append((parent, name, child))
    try:
        yield model
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)
