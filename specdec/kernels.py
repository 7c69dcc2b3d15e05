"""CPU fast paths for batch-1 decoding that keep the model's arithmetic (same weights, same dtype).

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
            if isinstance(child, WeightMajorLinear) and hasattr(child, "original"):
                setattr(parent, name, child.original[0])
                swapped.append((parent, name, child))
    try:
        yield model
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)
