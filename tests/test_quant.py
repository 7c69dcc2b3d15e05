"""The GGUF block formats on specdec/native/_quant.c: dequantisation bit for bit equal to the gguf package's reference,
the product equal to the quantised arithmetic it claims (8-bit activations per block, integer dots), batch-invariant
bit for bit, and every call checked before it enters C."""

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from specdec.gguf import quant
from specdec.gguf.quant import (
    BLOCKS,
    QuantMatrix,
    UnsupportedTensorType,
    random_quant_matrix,
    reference_dequantize,
)

pytestmark = pytest.mark.skipif(not quant.available(), reason="specdec.native._quant not available here")
QUANT_TYPES = ("Q4_K", "Q6_K", "Q5_0", "Q8_0")
GGUF_FILES = sorted(Path("resources/gguf").glob("*.gguf"))


def study_rows(path, name, info, count: int = 64) -> tuple[np.ndarray, QuantMatrix]:
    """The first `count` rows of a study file's tensor (`info` from its header): the raw bytes and the matrix."""
    row_bytes = quant.row_bytes(info.qtype, info.shape[1])
    rows = np.fromfile(path, dtype=np.uint8, count=count * row_bytes, offset=info.offset).reshape(count, -1)
    return rows, QuantMatrix(torch.from_numpy(rows), info.qtype, info.shape[1], name)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("qtype", [*QUANT_TYPES, "F32", "F16"])
def test_dequantisation_equals_the_gguf_reference_bit_for_bit(qtype):
    matrix = random_quant_matrix(qtype, 24, 512, seed=7)
    expected = reference_dequantize(matrix.raw.numpy(), qtype).reshape(24, 512)
    assert torch.equal(_bits(matrix.dequantize_rows()), _bits(torch.from_numpy(expected)))
    picked = matrix.dequantize_rows([5, 0, 23, 5])  # an embedding lookup: any rows, repeated
    assert torch.equal(_bits(picked), _bits(torch.from_numpy(expected[[5, 0, 23, 5]])))


@pytest.mark.parametrize("layout", ["rows", "r16"])
@pytest.mark.parametrize("qtype", quant.REQUANTIZE_TYPES)
@pytest.mark.parametrize("source", QUANT_TYPES)
def test_a_requantised_matrix_is_the_gguf_quantiser_s_blocks_of_its_values_in_its_own_layout(source, qtype, layout,
                                                                                           monkeypatch):
    """requantized(T): the gguf package's T blocks of this matrix's values (in chunks of rows: here 16, so three
    chunks, the last short), held in the matrix's own layout; itself where it is of type T already."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    monkeypatch.setattr(quant, "REQUANTIZE_CHUNK_ROWS", 16)
    matrix = random_quant_matrix(source, 48, 512, seed=3).in_layout(layout)
    got = matrix.requantized(qtype)
    if qtype == source:
        assert got is matrix
        return
    expected = quantize(matrix.dequantize_rows().numpy(), GGMLQuantizationType[qtype])
    assert (got.qtype, got.layout, got.shape) == (qtype, layout, matrix.shape)
    assert np.array_equal(got.in_layout("rows").raw.numpy(), expected)


@pytest.mark.parametrize("bad", ["Q4_K", "Q6_K", "F32", "q5_0", None])
def test_requantising_to_a_type_the_reference_cannot_write_is_refused(bad):
    with pytest.raises(ValueError, match=r"requantising writes Q5_0, Q8_0 only, got"):
        random_quant_matrix("Q8_0", 16, 64, seed=1).requantized(bad)


@pytest.mark.skipif(not GGUF_FILES, reason="no GGUF files under resources/gguf (the models stage makes them)")
def test_every_tensor_type_of_the_study_files_dequantises_as_the_gguf_package_does():
    from specdec.gguf.header import read_header

    seen = set()
    for path in GGUF_FILES:
        for name, info in read_header(path, string_arrays=()).tensors.items():  # the table alone: no vocabulary
            if info.qtype in seen or len(info.shape) != 2:
                continue
            seen.add(info.qtype)
            rows, matrix = study_rows(path, name, info)
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
def test_a_row_is_the_same_bits_whatever_shares_the_call_and_on_any_thread_count(qtype, threads, kernel):
    matrix = random_quant_matrix(qtype, 29, 512, seed=11)  # 29 rows: not a multiple of anything
    torch.manual_seed(0)
    x = torch.randn(40, 512)
    alone = torch.cat([matrix.matmul(x[i:i + 1]) for i in range(40)])
    # every grouping of the inputs (4, Q6_K's avx2 rows 6, AVX-512's 8 share each unpacked piece)
    for rows in range(1, 41):
        assert torch.equal(_bits(matrix.matmul(x[:rows])), _bits(alone[:rows])), rows
    assert torch.equal(_bits(matrix.matmul(x[7:19])), _bits(alone[7:19]))


@pytest.mark.parametrize("qtype", [*QUANT_TYPES, "F32", "F16"])
@pytest.mark.parametrize("in_features", [256, 512, 1536, 2304])
def test_every_kernel_gives_the_avx2_kernels_bits(qtype, in_features, kernel, threads):
    """The AVX-512 kernel folds its 16 integer lanes onto the AVX2 kernel's 8 and keeps its float epilogue, and the
    AMX kernel's tiles (Q4_K, 3..16 rows, the first 32 of the 45 outputs) form the same integer totals: the same bits
    for every type, ragged output counts, 1..16 rows, blocks per row from 1 to 9 (Q4_K's epilogue takes eight blocks
    at a time), on 1 and 2 threads."""
    matrix = random_quant_matrix(qtype, 45, in_features, seed=in_features + 3)
    torch.manual_seed(in_features)
    x, bias = torch.randn(16, in_features) * 4, torch.randn(45)
    with quant.use_kernel("avx2"):
        reference = [matrix.matmul(x[:rows], bias) for rows in range(1, 17)]
    for rows in range(1, 17):
        assert torch.equal(_bits(matrix.matmul(x[:rows], bias)), _bits(reference[rows - 1])), (kernel, rows)


@pytest.mark.skipif(not GGUF_FILES, reason="no GGUF files under resources/gguf (the models stage makes them)")
def test_every_kernel_gives_the_same_bits_on_the_study_files_weights(kernel):
    """Real weights (the files' scales and quants, not random ones): 64 rows of each matrix type of each file."""
    from specdec.gguf.header import read_header

    torch.manual_seed(5)
    checked = set()
    for path in GGUF_FILES:
        for name, info in read_header(path, string_arrays=()).tensors.items():
            if (path, info.qtype) in checked or len(info.shape) != 2:
                continue
            checked.add((path, info.qtype))
            _, matrix = study_rows(path, name, info)
            x = torch.randn(9, info.shape[1])
            with quant.use_kernel("avx2"):
                reference = matrix.matmul(x)
            assert torch.equal(_bits(matrix.matmul(x)), _bits(reference)), (path.name, name)
    assert checked


def test_the_kernel_is_chosen_per_machine_and_can_be_named(monkeypatch):
    runnable = quant.kernels()
    assert runnable[0] == "avx2" and set(runnable) <= {"avx2", "avx512-vnni-256", "avx512-vnni", "amx"}
    monkeypatch.delenv(quant.KERNEL_ENV, raising=False)
    assert quant.kernel_name() == runnable[-1]  # the fastest this CPU runs
    monkeypatch.setenv(quant.KERNEL_ENV, "avx2")
    assert quant.kernel_name() == "avx2"
    with quant.use_kernel(runnable[-1]):  # a block's choice wins over the environment's
        assert quant.kernel_name() == runnable[-1]
    assert quant.kernel_name() == "avx2"


@pytest.mark.parametrize("name", ["avx3", "AVX2", ""])
def test_a_kernel_this_cpu_does_not_run_is_refused_by_name(monkeypatch, name):
    with pytest.raises(ValueError, match="not a product kernel this CPU runs; it runs avx2"):
        with quant.use_kernel(name):
            pass
    monkeypatch.setenv(quant.KERNEL_ENV, name or "none")
    with pytest.raises(ValueError, match=f"{quant.KERNEL_ENV}="):
        random_quant_matrix("Q4_K", 8, 256).matmul(torch.randn(1, 256))


def test_the_native_call_checks_the_kernel_it_is_given():
    """What quant.py passes is checked again in C: an unknown name is refused before any pointer is followed."""
    from specdec.native import _quant

    matrix = random_quant_matrix("Q8_0", 8, 64)
    x, y = torch.randn(1, 64), torch.empty(1, 8)
    with pytest.raises(ValueError, match="unknown product kernel avx3"):
        _quant.matmul("Q8_0", matrix.raw.data_ptr(), 68, x.data_ptr(), 0, y.data_ptr(), 8, 64, 1, 1, "avx3")
    for name in ("avx512-vnni-256", "avx512-vnni", "amx"):
        if name not in quant.kernels():
            with pytest.raises(ValueError, match=f"cannot run the {name} product kernel"):
                _quant.matmul("Q8_0", matrix.raw.data_ptr(), 68, x.data_ptr(), 0, y.data_ptr(), 8, 64, 1, 1, name)


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


# --- Q4_K, Q6_K, Q5_0 and Q8_0 in groups of 16 rows (layout "r16": the AVX-512 kernels' own) -----------------------
GROUPED_TYPES = ("Q4_K", "Q6_K", "Q5_0", "Q8_0")
GROUP_BLOCK_BYTES = {"Q4_K": 148, "Q6_K": 210, "Q5_0": 22, "Q8_0": 34}  # a row's share of a group's block
# row widths: 1, 2, 6 and 9 K-quant blocks; 1, 3, 9 and 28 blocks of 32 (the 0.5B file's 896)
GROUP_WIDTHS = {"Q4_K": (256, 512, 1536, 2304), "Q6_K": (256, 512, 1536, 2304), "Q5_0": (32, 96, 288, 896),
                "Q8_0": (32, 96, 288, 896)}


@pytest.mark.parametrize("qtype", GROUPED_TYPES)
@pytest.mark.parametrize("rows, in_features", [(16, 256), (48, 1536), (32, 2304)])
def test_groups_of_16_rows_keep_every_byte_and_dequantise_as_the_gguf_package_does(qtype, rows, in_features):
    matrix = random_quant_matrix(qtype, rows, in_features, seed=rows + in_features)
    grouped = matrix.in_layout("r16")
    assert (grouped.layout, grouped.kernel_type, grouped.qtype) == ("r16", f"{qtype}_R16", qtype)
    blocks = in_features // quant.BLOCKS[qtype][0]
    assert grouped.raw.shape == (rows, blocks * GROUP_BLOCK_BYTES[qtype])
    assert grouped.nbytes == rows * blocks * GROUP_BLOCK_BYTES[qtype]
    assert torch.equal(grouped.in_layout("rows").raw, matrix.raw)  # the file's bytes again, byte for byte
    assert not torch.equal(grouped.raw[:, :matrix.raw.shape[1]], matrix.raw)  # the bytes did move
    expected = torch.from_numpy(reference_dequantize(matrix.raw.numpy(), qtype).reshape(rows, in_features))
    assert torch.equal(_bits(grouped.dequantize_rows()), _bits(expected))
    picked = [rows - 1, 0, 17 % rows, 0]  # rows of different groups, repeated
    assert torch.equal(_bits(grouped.dequantize_rows(picked)), _bits(expected[picked]))


@pytest.mark.parametrize("qtype, in_features", [(t, k) for t in GROUPED_TYPES for k in GROUP_WIDTHS[t]])
def test_groups_of_16_rows_give_the_file_layouts_bits(qtype, in_features, kernel, threads):
    """Every kernel's group functions give the row code's bits (avx2's Q8_0 by sign, as its rows; the random blocks
    hold quants of -128):
    1..16 rows (passes of up to eight inputs over a group for Q4_K and Q6_K, four for Q5_0 and Q8_0; on AMX, Q4_K
    from 13 rows on tiles), blocks per row from 1 to 28, with and without a bias.
    Since the row code's rows are batch-invariant (above), so are the groups'."""
    matrix = random_quant_matrix(qtype, 64, in_features, seed=in_features + 9)
    grouped = matrix.in_layout("r16")
    torch.manual_seed(in_features)
    x, bias = torch.randn(16, in_features) * 4, torch.randn(64)
    with quant.use_kernel("avx2"):
        reference = [matrix.matmul(x[:rows], bias) for rows in range(1, 17)]
        plain = matrix.matmul(x[:5])
    for rows in range(1, 17):
        assert torch.equal(_bits(grouped.matmul(x[:rows], bias)), _bits(reference[rows - 1])), (kernel, rows)
    assert torch.equal(_bits(grouped.matmul(x[:5])), _bits(plain))


@pytest.mark.parametrize("qtype", GROUPED_TYPES)
@pytest.mark.parametrize("layout", ["rows", "r16"])
def test_a_long_pass_gives_every_row_its_one_row_bits(qtype, layout, kernel, threads):
    """A prompt's pass: 70 rows of 8960 values (the down product's width) are more than one chunk of inputs per pass
    over the weights (24-48 rows here) and, on AMX, several tiles of inputs sharing each unpacked group (rows of
    Q4_K, and Q4_K in groups of 16 from 48 rows on; 17 and 33 grouped rows run in passes of up to 8 inputs with the
    weights as B): every row gets the bits of its one-row product on the AVX2 kernel, whatever the split."""
    matrix = random_quant_matrix(qtype, 32, 8960, seed=21).in_layout(layout)
    torch.manual_seed(21)
    x, bias = torch.randn(70, 8960), torch.randn(32)
    with quant.use_kernel("avx2"):
        alone = torch.cat([matrix.matmul(x[i:i + 1], bias) for i in range(70)])
    for rows in (70, 33, 17):
        assert torch.equal(_bits(matrix.matmul(x[:rows], bias)), _bits(alone[:rows])), (kernel, layout, rows)


@pytest.mark.skipif(not GGUF_FILES, reason="no GGUF files under resources/gguf (the models stage makes them)")
@pytest.mark.parametrize("qtype", GROUPED_TYPES)
def test_the_study_files_weights_give_the_same_bits_in_groups_of_16_rows(qtype, kernel):
    from specdec.gguf.header import read_header

    torch.manual_seed(6)
    checked = 0
    for path in GGUF_FILES:
        found = [(n, t) for n, t in read_header(path, string_arrays=()).tensors.items()
                 if t.qtype == qtype and len(t.shape) == 2]
        for name, info in found[:1] + found[-1:]:  # a layer's matrix and the head (or the last layer's)
            _, matrix = study_rows(path, name, info)
            grouped = matrix.in_layout("r16")
            assert torch.equal(grouped.in_layout("rows").raw, matrix.raw)
            x = torch.randn(9, info.shape[1])
            for m in (1, 2, 5, 9):
                assert torch.equal(_bits(grouped.matmul(x[:m])), _bits(matrix.matmul(x[:m]))), (path.name, name, m)
            checked += 1
    assert checked


def test_a_layout_that_cannot_hold_the_matrix_is_refused():
    with pytest.raises(ValueError, match="whole groups of 16 rows, got 29"):
        random_quant_matrix("Q4_K", 29, 256, name="odd").in_layout("r16")
    with pytest.raises(ValueError, match="whole groups of 16 rows, got 40"):
        random_quant_matrix("Q8_0", 40, 64, name="odd").in_layout("r16")
    with pytest.raises(ValueError, match="F32 has no layout 'r16'"):
        random_quant_matrix("F32", 32, 256).in_layout("r16")
    f16 = random_quant_matrix("F16", 32, 256)
    with pytest.raises(ValueError, match="r16 for Q4_K, Q6_K, Q5_0, Q8_0 only"):
        QuantMatrix(f16.raw, "F16", 256, "head", layout="r16")
    q4 = random_quant_matrix("Q4_K", 32, 256)
    with pytest.raises(ValueError, match="144 bytes per row, but 256 Q4_K values take 148 in layout r16"):
        QuantMatrix(q4.raw, "Q4_K", 256, "q", layout="r16")
    with pytest.raises(ValueError, match="layout 'r32'"):
        QuantMatrix(q4.raw, "Q4_K", 256, "q", layout="r32")


def test_the_native_calls_check_the_grouped_layouts_sizes():
    """What quant.py checks is checked again in C: groups of 16 rows, whole blocks, and no dequantisation of grouped
    bytes as if they were rows."""
    from specdec.native import _quant

    grouped = random_quant_matrix("Q4_K", 32, 256).in_layout("r16")
    x, y, out = torch.randn(1, 256), torch.empty(1, 32), torch.empty(32, 148, dtype=torch.uint8)
    kernel = quant.kernel_name()
    with pytest.raises(ValueError, match="bad product sizes: N 24"):
        _quant.matmul("Q4_K_R16", grouped.raw.data_ptr(), 148, x.data_ptr(), 0, y.data_ptr(), 24, 256, 1, 1, kernel)
    with pytest.raises(ValueError, match="bad product sizes"):  # the file's 144 bytes a block, not the groups' 148
        _quant.matmul("Q4_K_R16", grouped.raw.data_ptr(), 144, x.data_ptr(), 0, y.data_ptr(), 32, 256, 1, 1, kernel)
    for n, k in ((24, 256), (32, 300), (-16, 256)):
        with pytest.raises(ValueError, match=f"Q4_K groups of 16 rows need .* got {n} x {k}"):
            _quant.r16_pack("Q4_K", grouped.raw.data_ptr(), out.data_ptr(), n, k)
    with pytest.raises(ValueError, match="Q5_0 groups of 16 rows need .* multiple of 32 values a row, got 32 x 48"):
        _quant.r16_pack("Q5_0", grouped.raw.data_ptr(), out.data_ptr(), 32, 48)
    with pytest.raises(ValueError, match="only Q4_K, Q6_K, Q5_0 and Q8_0 have groups of 16 rows, not F16"):
        _quant.r16_unpack("F16", grouped.raw.data_ptr(), out.data_ptr(), 32, 256)
    for name in ("Q4_K_R16", "Q6_K_R16", "Q5_0_R16", "Q8_0_R16"):
        with pytest.raises(ValueError, match=f"{name} rows are dequantised after unpacking them"):
            _quant.dequantize(name, grouped.raw.data_ptr(), y.data_ptr(), 1, 256)


def test_the_layout_a_model_loads_with_follows_the_kernel_and_can_be_named(monkeypatch):
    monkeypatch.delenv(quant.LAYOUT_ENV, raising=False)
    wide = quant.kernel_name() != "avx2"
    assert quant.preferred_layout("Q4_K", 32) == "r16"  # every kernel multiplies Q4_K's groups fastest
    assert quant.preferred_layout("Q6_K", 32) == ("r16" if wide else "rows")
    assert quant.preferred_layout("Q5_0", 32) == quant.preferred_layout("Q8_0", 32) == "r16"
    assert quant.preferred_layout("Q4_K", 24) == "rows" and quant.preferred_layout("F16", 32) == "rows"
    with quant.use_kernel("avx2"):
        assert quant.preferred_layout("Q4_K", 32) == "r16" and quant.preferred_layout("Q6_K", 32) == "rows"
        assert quant.preferred_layout("Q5_0", 32) == quant.preferred_layout("Q8_0", 32) == "r16"
    # every grouped type can load in groups, on any kernel (each has its group functions): not F16, not ragged
    assert [quant.can_group(t, 32) for t in ("Q4_K", "Q6_K", "Q5_0", "Q8_0", "F16")] == [True] * 4 + [False]
    assert not quant.can_group("Q8_0", 24)
    monkeypatch.setenv(quant.LAYOUT_ENV, "rows")
    assert quant.preferred_layout("Q4_K", 32) == "rows"
    monkeypatch.setenv(quant.LAYOUT_ENV, "r32")
    with pytest.raises(ValueError, match="SPECDEC_QUANT_LAYOUT='r32': expected 'auto' or 'rows'"):
        quant.preferred_layout("Q4_K", 32)


def test_a_float_matrix_quantised_to_q8_0_holds_the_gguf_packages_blocks():
    """quant.quantize_q8_0 (a draft head's own weights): the gguf package's Q8_0 bytes, in the layout models load
    with, each value within about half a quantisation step of the float it came from; shapes it cannot hold are
    refused."""
    from gguf.quants import quantize

    torch.manual_seed(2)
    weight = torch.randn(48, 96)
    matrix = quant.quantize_q8_0(weight, "head.q_proj")
    assert matrix.layout == quant.preferred_layout("Q8_0", 48)
    expected = quantize(weight.numpy(), quant._gguf_type("Q8_0"))
    assert np.array_equal(matrix.in_layout("rows").raw.numpy(), expected.reshape(48, -1))
    step = weight.reshape(48, 3, 32).abs().amax(-1, keepdim=True) / 127
    error = (matrix.dequantize_rows() - weight).reshape(48, 3, 32).abs()
    # half a step, plus the fp16 scale's rounding times up to 127 (2^-11 relative): 0.56 of a step at most
    assert bool((error <= 0.57 * step).all()) and float(error.max()) > 0.3 * float(step.min())
    with pytest.raises(ValueError, match="head.fc: Q8_0 rows hold a multiple of 32 values, got 40"):
        quant.quantize_q8_0(torch.randn(8, 40), "head.fc")
    with pytest.raises(ValueError, match="quantises a floating-point matrix"):
        quant.quantize_q8_0(torch.ones(8, 32, dtype=torch.int32))


def test_weight_buffers_are_writable_bytes_of_the_shape_asked_for():
    """Matrices' bytes live in numpy-allocated memory (2 MB pages where Linux grants them); the loaders copy into
    it and the kernels read it as any uint8 tensor."""
    buffer = quant.weight_bytes(3, 5)
    assert buffer.shape == (3, 5) and buffer.dtype == torch.uint8 and buffer.is_contiguous()
    buffer.fill_(7)
    assert int(buffer.sum()) == 105
    grouped = random_quant_matrix("Q4_K", 16, 256).in_layout("r16")
    assert grouped.raw.shape == (16, quant.row_bytes("Q4_K", 256, "r16"))


# The product functions that ask for their weights ahead (row_prefetch, r16_prefetch_step in _quant_kernels.h): the
# row functions, the group functions of every kernel family at every input count, the argmax head's first pass over
# rows and over groups of 16 rows.
PREFETCHING_FUNCTIONS = re.compile(r"^(row_q(4_k|6_k|5_0|8_0)(_256|_512)?"
                                   r"|group_q(4_k|6_k|5_0|8_0)_r16_(256|512|avx2)|hi4_row_(avx2|vnni)"
                                   r"|hi4_group(_avx2)?)_\d+$")


def function_bodies(library: str) -> dict[str, str]:
    """name -> the disassembly of each of those functions of a shared library: one objdump of the whole text, cut at
    its function headers ("0000000000012340 <row_q4_k_1>:")."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", library], check=True, capture_output=True,
                          text=True).stdout
    pieces = re.split(r"^[0-9a-f]+ <([^>]+)>:$", text, flags=re.MULTILINE)
    return {name: body for name, body in zip(pieces[1::2], pieces[2::2]) if PREFETCHING_FUNCTIONS.match(name)}


@pytest.mark.skipif(not shutil.which("objdump"), reason="needs objdump (binutils)")
def test_every_product_function_that_asks_for_its_weights_ahead_does_in_the_build():
    """A prefetch changes no value, so no bit test notices one the compiler dropped: GCC 12 removed the call to a
    prefetch helper it kept out of line (a function with no visible effect), leaving every row function and every
    one-input group function of an earlier build without one. The built functions must hold the instruction."""
    from specdec.native import _quant

    bodies = function_bodies(_quant.__file__)
    assert len(bodies) >= 100, sorted(bodies)  # the names still match the build's functions
    assert {"row_q6_k_1", "row_q4_k_512_5", "group_q6_k_r16_512_1", "group_q4_k_r16_256_8", "group_q4_k_r16_avx2_1",
            "group_q5_0_r16_avx2_4", "hi4_row_vnni_1", "hi4_group_1", "hi4_group_avx2_1"} <= set(bodies)
    missing = sorted(name for name, text in bodies.items() if "prefetch" not in text)
    assert not missing, f"no prefetch instruction in {missing}"
