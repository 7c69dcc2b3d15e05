"""The CPU linear fast paths keep the layer's weights: same outputs as the plain layer, swapped in and out."""

import pytest
import torch
from torch import nn

from specdec.kernels import (
    RowAdaptiveBf16Linear,
    default_linear,
    use_row_adaptive_bf16_linear,
)
from specdec.testing import tiny_qwen2


def test_row_adaptive_bf16_linear_uses_bf16_for_few_rows_and_the_same_values_in_fp32_for_many():
    torch.manual_seed(0)
    linear = nn.Linear(24, 40).to(torch.bfloat16)
    layer = RowAdaptiveBf16Linear(linear, max_bf16_rows=4)
    assert torch.equal(layer.weight_fp32.to(torch.bfloat16), linear.weight)  # exactly the bf16 values
    for rows in (1, 4):
        x = torch.randn(1, rows, 24).to(torch.bfloat16)
        assert torch.equal(layer(x), linear(x))
    x = torch.randn(1, 9, 24).to(torch.bfloat16)
    out = layer(x)
    expected = nn.functional.linear(x.float(), linear.weight.float(), linear.bias.float()).to(torch.bfloat16)
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected)
    with pytest.raises(TypeError, match="bfloat16"):
        RowAdaptiveBf16Linear(nn.Linear(4, 4))


def test_use_row_adaptive_bf16_linear_keeps_the_state_dict_and_swaps_back():
    model = tiny_qwen2(vocab_size=64, hidden_size=32, seed=0).to(torch.bfloat16)
    keys = set(model.state_dict())
    use_row_adaptive_bf16_linear(model)
    n_linear = sum(isinstance(m, RowAdaptiveBf16Linear) for m in model.modules())
    assert n_linear == 2 * 7 + 1 and set(model.state_dict()) == keys  # 7 per layer + LM head; no new entries
    with default_linear(model):
        assert not any(isinstance(m, RowAdaptiveBf16Linear) for m in model.modules())
    assert sum(isinstance(m, RowAdaptiveBf16Linear) for m in model.modules()) == n_linear
