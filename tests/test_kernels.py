"""The CPU linear fast paths keep the layer's weights: same outputs as the plain layer, swapped in and out."""

import copy

import pytest
import torch
from torch import nn

from specdec.fp32.kernels import RowAdaptiveBf16Linear, default_linear, use_row_adaptive_bf16_linear
from specdec.fp32.kernel_tables import backend_spans
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


# --- the fp32 backends and their per-row-count tables ----------------------------------------------------------------
from specdec.fp32.kernels import (
    BACKENDS,
    BackendLinear,
    available_backends,
    linear_backends,
    time_backends,
    use_backends,
)
from specdec.fp32.kernel_tables import fastest_backends


THREADS = (1, 2)  # the OpenMP path (2) and the serial one; conftest sets 1 for the rest of the suite
RAGGED_K = (3, 7, 8, 13, 300)  # below one 8-wide lane, ragged tails, exactly one lane, several K tiles


@pytest.fixture(params=THREADS, ids=lambda n: f"threads{n}")
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("backend", available_backends())
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_every_backend_computes_the_layer_for_every_row_count(backend, bias, threads):
    """Rows 1..40 on the backend named by the case (the table is stretched to 40 rows so that no row count falls
    through to another backend), ragged K, a non-contiguous input."""
    for in_features in RAGGED_K:
        torch.manual_seed(in_features)
        linear = nn.Linear(in_features, 29, bias=bias)  # 29 outputs: a partial block of output rows
        layer = BackendLinear(linear, backend, max_rows=40)
        for rows in range(1, 41):
            assert layer.backend_for(rows) == backend
            x = torch.randn(1, rows, in_features)
            torch.testing.assert_close(layer(x), linear(x), rtol=1e-5, atol=1e-5)
        wide = torch.randn(7, 2 * in_features)
        strided = wide[:, ::2]  # non-contiguous rows
        torch.testing.assert_close(layer(strided), linear(strided.contiguous()), rtol=1e-5, atol=1e-5)
    assert layer.weight is linear.weight  # shared, not copied


def test_tables_fill_gaps_from_below_and_prompt_passes_run_weight_major():
    layer = BackendLinear(nn.Linear(8, 8), "linear", {1: "weight_major", 3: "linear"})
    assert [layer.backend_for(r) for r in (1, 2, 3, 9, 16)] == ["weight_major"] * 2 + ["linear"] * 3
    assert layer.backend_for(17) == "weight_major"  # beyond the table: compute-bound, W @ x^T
    assert BackendLinear(nn.Linear(8, 8), "linear").backend_for(64) == "linear"  # plain F.linear when asked for
    with pytest.raises(ValueError, match="unknown linear backend"):
        BackendLinear(nn.Linear(8, 8), "fastest")


def test_backends_are_timed_per_shape_and_row_count_and_the_fastest_is_chosen():
    model = tiny_qwen2(vocab_size=64, hidden_size=32, seed=0, dtype=torch.float32)
    timings = time_backends(model, rows=[1, 2], repeats=2)
    shapes = {row["shape"] for row in timings}
    assert shapes == {"32x32", "16x32", "64x32", "32x64"}  # q/o, k/v, gate/up + LM head, down
    assert {(row["rows"], row["backend"]) for row in timings} == {(r, b) for r in (1, 2) for b in available_backends()}
    tables = fastest_backends(timings)
    for shape, table in tables.items():
        for rows, backend in table.items():
            times = {r["backend"]: r["seconds"] for r in timings if r["shape"] == shape and r["rows"] == rows}
            assert times[backend] == min(times.values())
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    expected = model(input_ids=ids).logits
    use_backends(model, "linear", tables)
    torch.testing.assert_close(model(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-4)
    assert set(linear_backends(model, 1).split("+")) <= set(BACKENDS)


def test_a_backend_this_machine_lacks_is_refused():
    if "avx2" in available_backends():
        pytest.skip("this machine has the avx2 backend")
    with pytest.raises(RuntimeError, match="not available"):
        BackendLinear(nn.Linear(4, 4), "avx2")


def test_backend_spans_group_consecutive_row_counts():
    tables = {"8x4": {1: "avx2", 2: "avx2", 3: "linear", 4: "avx2", 5: "avx2"}, "4x4": {1: "linear"}}
    assert backend_spans(tables) == {"8x4": {"1-2": "avx2", "3": "linear", "4-5": "avx2"}, "4x4": {"1": "linear"}}


def test_the_avx2_kernel_over_several_k_tiles_and_input_passes():
    """K = 300: two full tiles, a partial one and a scalar tail; rows up to 40: several chunks and passes."""
    if "avx2" not in available_backends():
        pytest.skip("no avx2 backend on this machine")
    torch.manual_seed(2)
    linear = nn.Linear(300, 21)
    for rows in (1, 4, 5, 9, 16, 19, 40):
        x = torch.randn(rows, 300)
        torch.testing.assert_close(BACKENDS["avx2"](x, linear.weight, linear.bias), linear(x), rtol=1e-5, atol=1e-5)


# --- bf16 layers: torch's product or the AVX2 kernel reading bf16 weights -----------------------------------------
from specdec.fp32.kernels import BF16_MAX_ROWS, available_bf16_backends, tune_row_adaptive_bf16
from specdec.fp32.kernel_tables import BF16_CHOICES


@pytest.mark.parametrize("bias", [True, False])
def test_the_avx2_bf16_backend_computes_the_bf16_layer_in_fp32(bias):
    if "avx2" not in available_backends():
        pytest.skip("no avx2 backend on this machine")
    torch.manual_seed(3)
    linear = nn.Linear(300, 29, bias=bias).to(torch.bfloat16)
    layer = RowAdaptiveBf16Linear(linear, max_bf16_rows=8, backend="avx2-bf16")
    for rows in (1, 2, 3, 4, 7, 8, 9):  # 9: beyond max_bf16_rows, the fp32 copy
        x = torch.randn(1, rows, 300).to(torch.bfloat16)
        expected = nn.functional.linear(x.float(), linear.weight.float(),
                                        None if linear.bias is None else linear.bias.float())
        out = layer(x)
        assert out.dtype == torch.bfloat16 and layer.backend_for(rows) == ("avx2-bf16" if rows <= 8 else "bf16-as-fp32")
        # the same fp32 product up to summation order, then one rounding to bf16: at most one bf16 step apart
        torch.testing.assert_close(out.float(), expected.to(torch.bfloat16).float(), rtol=8e-3, atol=1e-3)
    assert layer.weight is linear.weight  # the bf16 weight is read as it is, not copied


def test_each_bf16_backend_reads_the_bf16_weights_up_to_its_own_row_limit():
    linear = nn.Linear(16, 8).to(torch.bfloat16)
    for backend in available_bf16_backends():
        layer = RowAdaptiveBf16Linear(linear, backend=backend)
        limit = BF16_MAX_ROWS[backend]
        assert layer.backend_for(limit) == backend and layer.backend_for(limit + 1) == "bf16-as-fp32"
    # the AVX2 kernel keeps a hybrid's catch-up over a short prompt (up to 32 rows) on the bf16 weights
    assert BF16_MAX_ROWS["avx2-bf16"] >= 32 > BF16_MAX_ROWS["bf16"]


def test_bf16_products_are_chosen_per_shape_and_row_count_by_timing_and_used():
    model = tiny_qwen2(vocab_size=64, hidden_size=32, seed=0).to(torch.bfloat16)
    reference = copy.deepcopy(model)
    use_row_adaptive_bf16_linear(model)
    tables = tune_row_adaptive_bf16(model, rows=(1, 4, 16), repeats=1)
    assert set(tables) == {"32x32", "16x32", "64x32", "32x64"}
    for table in tables.values():
        assert set(table) == {1, 4, 16, "beyond"} and set(table.values()) <= set(BF16_CHOICES)
        assert table["beyond"] != "avx2-bf16"  # past the timed rows only the products that scale with rows
        if "avx2" not in available_backends():
            assert "avx2-bf16" not in table.values()
    layers = [m for m in model.modules() if isinstance(m, RowAdaptiveBf16Linear)]
    for layer in layers:  # every layer runs its shape's measured choice; counts between timed ones share the one below
        table = tables[f"{layer.out_features}x{layer.in_features}"]
        assert [layer.backend_for(r) for r in (1, 3, 4, 15, 16, 17, 500)] == [
            table[1], table[1], table[4], table[4], table[16], table["beyond"], table["beyond"]]
    # whatever was chosen, the layers compute the bf16 model: the logits of torch's own bf16 layers, up to
    # fp32-vs-bf16 accumulation (a few bf16 steps here and there; a wrong product would be off everywhere)
    ids = torch.randint(0, 64, (1, 20))
    with torch.inference_mode():
        difference = (model(ids).logits.float() - reference(ids).logits.float()).abs()
    assert difference.mean() < 0.05 and difference.max() < 0.3, (difference.mean(), difference.max())
    with pytest.raises(ValueError, match="unknown bf16 product"):
        RowAdaptiveBf16Linear(nn.Linear(4, 4).to(torch.bfloat16), table={1: "amx"})
    with pytest.raises(ValueError, match="unknown bf16 backend"):
        RowAdaptiveBf16Linear(nn.Linear(4, 4).to(torch.bfloat16), backend="amx")


def test_a_bf16_table_picks_the_timed_count_below_and_beyond_the_largest_its_own_product():
    torch.manual_seed(4)
    linear = nn.Linear(24, 40).to(torch.bfloat16)
    layer = RowAdaptiveBf16Linear(linear, table={1: "bf16", 8: "bf16-as-fp32"}, beyond="bf16")
    assert [layer.backend_for(r) for r in (1, 7, 8, 9, 300)] == ["bf16", "bf16", "bf16-as-fp32", "bf16", "bf16"]
    for rows, product in ((3, "bf16"), (8, "bf16-as-fp32"), (40, "bf16")):
        x = torch.randn(1, rows, 24).to(torch.bfloat16)
        expected = (linear(x) if product == "bf16" else
                    nn.functional.linear(x.float(), linear.weight.float(), linear.bias.float()).to(torch.bfloat16))
        assert torch.equal(layer(x), expected), rows
    layer.set_table(None)  # no table: the backend up to max_bf16_rows, the fp32 copy beyond
    assert layer.backend_for(BF16_MAX_ROWS["bf16"] + 1) == "bf16-as-fp32"


@pytest.mark.parametrize("product", [*available_bf16_backends(), "bf16-as-fp32"])
def test_every_bf16_product_computes_the_bf16_layer_for_every_row_count(product, threads):
    """Rows 1..40 on the product named by the case (a table that names it for every row count), ragged K."""
    for in_features in (8, 13, 300):
        torch.manual_seed(in_features)
        linear = nn.Linear(in_features, 29).to(torch.bfloat16)
        layer = RowAdaptiveBf16Linear(linear, table={1: product}, beyond=product)
        expected_weight, expected_bias = linear.weight.float(), linear.bias.float()
        for rows in range(1, 41):
            assert layer.backend_for(rows) == product
            x = torch.randn(1, rows, in_features).to(torch.bfloat16)
            expected = nn.functional.linear(x.float(), expected_weight, expected_bias)
            # one fp32 (or bf16) product up to summation order, then one rounding to bf16
            torch.testing.assert_close(layer(x).float(), expected, rtol=2e-2, atol=2e-2)
