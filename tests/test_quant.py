"""The GGUF block formats on specdec/_quant.c: dequantisation bit for bit equal to the gguf package's reference, the
product equal to the quantised arithmetic it claims (8-bit activations per block, integer dots), batch-invariant
bit for bit, and every call checked before it enters C."""

from pathlib import Path

import numpy as np
import pytest
import torch

from specdec import quant
from specdec.quant import (
    BLOCKS,
    QuantMatrix,
    UnsupportedTensorType,
    random_quant_matrix,
    reference_dequantize,
)

pytestmark = pytest.mark.skipif(not quant.available(), reason="specdec._quant not available here")
QUANT_TYPES = ("Q4_K", "Q6_K", "Q5_0", "Q8_0")
GGUF_FILES = sorted(Path("resources/gguf").glob("*.gguf"))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("qtype", [*QUANT_TYPES, "F32", "F16"])
def test_dequantisation_equals_the_gguf_reference_bit_for_bit(qtype):
    matrix = random_quant_matrix(qtype, 24, 512, seed=7)
    expected = reference_dequantize(matrix.raw.numpy(), qtype).reshape(24, 512)
    assert torch.equal(_bits(matrix.dequantize_rows()), _bits(torch.from_numpy(expected)))
    picked = matrix.dequantize_rows([5, 0, 23, 5])  # an embedding lookup: any rows, repeated
    assert torch.equal(_bits(picked), _bits(torch.from_numpy(expected[[5, 0, 23, 5]])))


@pytest.mark.skipif(not GGUF_FILES, reason="no GGUF files under resources/gguf (the models stage makes them)")
def test_every_tensor_type_of_the_study_files_dequantises_as_the_gguf_package_does():
    from specdec.gguf_header import read_header

    seen = set()
    for path in GGUF_FILES:
        for name, info in read_header(path, string_arrays=()).tensors.items():  # the table alone: no vocabulary
            if info.qtype in seen or len(info.shape) != 2:
                continue
            seen.add(info.qtype)
            row_bytes = quant.row_bytes(info.qtype, info.shape[1])
            rows = np.fromfile(path, dtype=np.uint8, count=64 * row_bytes, offset=info.offset).reshape(64, -1)
            matrix = QuantMatrix(torch.from_numpy(rows), info.qtype, info.shape[1], name)
            expected = reference_dequantize(rows, info.qtype).reshape(64, -1)
            assert torch.equal(_bits(matrix.dequantize_rows()), _bits(torch.from_numpy(expected))), name
    assert {"Q4_K", "Q6_K"} <= seen  # the target's types at least


def quantised_activations(x: torch.Tensor, block: int) -> torch.Tensor:
    """What the kernel multiplies by: each block of a row as int8 round(x * 127 / amax), times amax / 127."""
    blocks = x.numpy().astype(np.float32).reshape(x.shape[0], -1, block)
    amax = np.abs(blocks).max(-1, keepdims=True)
    inverse = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(blocks * inverse)
    return torch.from_numpy((q.astype(np.float64) * (amax / np.float32(127)).astype(np.float64)).reshape(x.shape))


@pytest.mark.parametrize("qtype", QUANT_TYPES)
@pytest.mark.parametrize("in_features", [256, 768, 1536])
def test_the_product_is_the_quantised_arithmetic_it_claims(qtype, in_features):
    """Against float64 on the dequantised weights and activations: 1e-6 of the scale, where an indexing error or a
    wrong scale is off by 1e-2 or more (the activations' own rounding is 1/254 of a block's largest value)."""
    matrix = random_quant_matrix(qtype, 37, in_features, seed=in_features)
    torch.manual_seed(in_features)
    x, bias = torch.randn(9, in_features) * 3, torch.randn(37)
    x_q = quantised_activations(x, BLOCKS[qtype][0] if BLOCKS[qtype][0] == 32 else 256)
    weights = matrix.dequantize_rows().double()
    expected = x_q @ weights.t() + bias.double()
    scale = x_q.abs() @ weights.abs().t()
    assert ((matrix.matmul(x, bias).double() - expected).abs() / scale).max() < 1e-6


@pytest.mark.parametrize("qtype", [*QUANT_TYPES, "F32", "F16"])
def test_a_row_is_the_same_bits_whatever_shares_the_call_and_on_any_thread_count(qtype, threads):
    matrix = random_quant_matrix(qtype, 29, 512, seed=11)  # 29 rows: not a multiple of anything
    torch.manual_seed(0)
    x = torch.randn(40, 512)
    alone = torch.cat([matrix.matmul(x[i:i + 1]) for i in range(40)])
    for rows in range(1, 41):  # every grouping of the inputs (four share each unpacked weight piece)
        assert torch.equal(_bits(matrix.matmul(x[:rows])), _bits(alone[:rows])), rows
    assert torch.equal(_bits(matrix.matmul(x[7:19])), _bits(alone[7:19]))


def test_the_invariance_check_can_fail():
    """Power of the check above: a row computed with another activation scale (a neighbour's block maximum
    leaking in) differs in its bits."""
    matrix = random_quant_matrix("Q4_K", 8, 256, seed=1)
    x = torch.randn(2, 256)
    spiked = x.clone()
    spiked[0, 0] = x[0].abs().max() * 1.01  # a larger block maximum: every quant of the row moves
    assert not torch.equal(matrix.matmul(x)[0], matrix.matmul(spiked)[0])


# --- every call checked -----------------------------------------------------------------------------------------
def test_a_tensor_type_the_engine_cannot_run_is_refused_by_name():
    with pytest.raises(UnsupportedTensorType, match="'blk.0.ffn_up.weight' has type Q3_K"):
        QuantMatrix(torch.zeros(2, 110, dtype=torch.uint8), "Q3_K", 256, "blk.0.ffn_up.weight")


@pytest.mark.parametrize("raw, error", [
    (torch.zeros(2, 144, dtype=torch.int8), "2-d uint8"),
    (torch.zeros(288, dtype=torch.uint8), "2-d uint8"),
    (torch.zeros(2, 143, dtype=torch.uint8), "143 bytes per row"),
])
def test_raw_bytes_that_do_not_hold_the_blocks_are_refused(raw, error):
    with pytest.raises((TypeError, ValueError), match=error):
        QuantMatrix(raw, "Q4_K", 256, "w")


def test_rows_of_a_width_the_format_cannot_hold_are_refused():
    with pytest.raises(ValueError, match="multiple of 256"):
        quant.row_bytes("Q4_K", 300)


@pytest.mark.parametrize("x, bias, error", [
    (torch.randn(2, 255), None, "floating-point \\(rows, 256\\)"),
    (torch.randn(256), None, "floating-point \\(rows, 256\\)"),
    (torch.ones(2, 256, dtype=torch.long), None, "floating-point"),
    (torch.randn(2, 256), torch.randn(7), "vector of 8"),
    (torch.randn(2, 256), torch.randn(8, 1), "vector of 8"),
    (torch.randn(2, 256, device="meta"), None, "CPU tensor"),
])
def test_a_product_the_kernel_cannot_take_is_refused_naming_the_tensor(x, bias, error):
    matrix = random_quant_matrix("Q4_K", 8, 256, name="blk.3.attn_q.weight")
    with pytest.raises(ValueError, match=f"blk.3.attn_q.weight: .*{error}"):
        matrix.matmul(x, bias)


def test_embedding_rows_out_of_range_are_refused():
    with pytest.raises(IndexError, match="rows must lie in"):
        random_quant_matrix("Q8_0", 8, 64).dequantize_rows([8])


def test_non_contiguous_activations_and_zero_rows_work():
    matrix = random_quant_matrix("Q6_K", 8, 256)
    wide = torch.randn(3, 512)
    assert torch.equal(matrix.matmul(wide[:, ::2]), matrix.matmul(wide[:, ::2].contiguous()))
    assert matrix.matmul(torch.empty(0, 256)).shape == (0, 8)
