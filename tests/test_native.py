"""The native kernels (specdec/native/_linear.c, specdec/native/_attention.c): built where they can be, every call
checked before it enters C, and batch-invariant bit for bit: a row's result does not depend on the other rows of the
call, on their number or on the thread count."""

import platform
import shutil
import subprocess
import sys

import pytest
import torch
from torch import nn

from specdec.native import attention

from specdec.fp32 import kernels
from specdec.native.attention import causal_attention
from specdec.fp32.kernels import (
    BACKENDS,
    BackendLinear,
    RowAdaptiveBf16Linear,
    _avx2,
    _avx2_bf16,
    available_backends,
    invariant_kernels_available,
    kernel_build,
    stale_native_modules,
    use_backends,
    use_invariant_kernels,
)
from specdec.lm import CachedLM
from specdec.testing import at_threads, count_differing_rows, step_and_pass_logits, tiny_qwen2

X86_WITH_COMPILER = platform.machine() in ("x86_64", "AMD64") and bool(shutil.which("cc") or shutil.which("gcc"))
needs_native = pytest.mark.skipif(not invariant_kernels_available(), reason="native kernels not available here")


def test_the_native_kernels_are_built_wherever_they_can_be():
    """On an x86 machine with a C compiler the install must have built both modules from their current sources: a
    silently failed build would leave the suite without kernel coverage and the study without its kernels."""
    if not X86_WITH_COMPILER:
        pytest.skip("not an x86 machine with a C compiler")
    flags = open("/proc/cpuinfo").read() if sys.platform == "linux" else ""
    if " avx2" not in flags or " fma" not in flags:
        pytest.skip("this x86 CPU has no AVX2/FMA")
    assert kernels._linear is not None and attention._attention is not None, "specdec's native modules were not built"
    assert invariant_kernels_available()
    assert stale_native_modules() == [], "rebuild: pip install -e ."
    assert all(len(part) == 12 for part in kernel_build().split("-"))


# --- every call checked before it enters C ---------------------------------------------------------------------
def _weight(out=8, inp=12, dtype=torch.float32):
    torch.manual_seed(0)
    return torch.randn(out, inp).to(dtype)


@needs_native
@pytest.mark.parametrize("product, wrong",
                         [(_avx2, torch.bfloat16), (_avx2, torch.float16), (_avx2_bf16, torch.float32)])
def test_a_weight_of_another_dtype_is_refused(product, wrong):
    # the fp32 kernel would read a bf16 buffer as floats: past its end, and garbage
    with pytest.raises(TypeError, match="model.layers.3.mlp.up_proj: the native product reads"):
        product(torch.randn(2, 12), _weight(dtype=wrong), None, layer="model.layers.3.mlp.up_proj")


@needs_native
def test_a_non_contiguous_weight_is_refused():
    weight = torch.randn(12, 8).t()  # (8, 12) with transposed strides: the kernel would read other values
    with pytest.raises(ValueError, match="lm_head: the weight must be contiguous"):
        _avx2(torch.randn(2, 12), weight, None, layer="lm_head")


@needs_native
def test_a_weight_on_another_device_is_refused():
    with pytest.raises(ValueError, match="is on meta"):
        _avx2(torch.randn(2, 12), torch.empty(8, 12, device="meta"), None)


@needs_native
@pytest.mark.parametrize("shape", [(8,), (2, 8, 12), (0, 12)])
def test_a_weight_that_is_not_a_non_empty_matrix_is_refused(shape):
    with pytest.raises(ValueError, match="non-empty 2-d"):
        _avx2(torch.randn(2, 12), torch.randn(shape), None)


@needs_native
@pytest.mark.parametrize("x", [torch.randn(2, 11), torch.randn(2, 13), torch.randn(12),
                               torch.ones(2, 12, dtype=torch.long)],
                         ids=["narrow", "wide", "1-d", "integer"])
def test_an_input_that_does_not_fit_the_weight_is_refused(x):
    # a narrower input would be read past its end, a wider one misaligned
    with pytest.raises(ValueError, match="the input must be a floating-point"):
        _avx2(x, _weight(), None)


@needs_native
@pytest.mark.parametrize("bias", [torch.randn(7), torch.randn(9), torch.randn(8, 1), torch.ones(8, dtype=torch.long)],
                         ids=["short", "long", "2-d", "integer"])
def test_a_bias_that_does_not_fit_the_weight_is_refused(bias):
    with pytest.raises(ValueError, match="the bias must be"):
        _avx2(torch.randn(2, 12), _weight(), bias)


@needs_native
def test_a_checked_call_names_the_layer_in_the_model():
    model = tiny_qwen2(vocab_size=64, hidden_size=32, seed=0, dtype=torch.float32)
    use_backends(model, "avx2")
    layer = model.model.layers[1].mlp.down_proj
    assert layer.name == "model.layers.1.mlp.down_proj"
    layer.weight.data = layer.weight.data.t().contiguous().t()  # same values, column-major
    with pytest.raises(ValueError, match="model.layers.1.mlp.down_proj: the weight must be contiguous"):
        model(torch.tensor([[1, 2, 3]]))


@needs_native
def test_zero_rows_give_an_empty_result_without_entering_c():
    assert _avx2(torch.empty(0, 12), _weight(), None).shape == (0, 8)


def _qkv(heads=4, kv_heads=2, rows=3, length=10, head_dim=16, dtype=torch.float32):
    torch.manual_seed(1)
    return (torch.randn(1, heads, rows, head_dim), torch.randn(1, kv_heads, length, head_dim).to(dtype),
            torch.randn(1, kv_heads, length, head_dim).to(dtype))


@needs_native
@pytest.mark.parametrize("case, error", [
    (dict(dtype=torch.float16), "keys and values must be"),
    (dict(heads=3), "not a multiple"),
    (dict(rows=11), "only 10 keys"),
    (dict(head_dim=520), "exceeds the kernel's 512"),
])
def test_attention_inputs_the_kernel_cannot_take_are_refused(case, error):
    q, k, v = _qkv(**case)
    with pytest.raises((TypeError, ValueError), match=error):
        causal_attention(q, k, v, 0.25)


@needs_native
def test_attention_refuses_mismatched_values_other_devices_and_batches():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="must match"):
        causal_attention(q, k, v[..., :8], 0.25)
    with pytest.raises(ValueError, match="is on meta"):
        causal_attention(q, k.to("meta"), v, 0.25)
    with pytest.raises(ValueError, match="batch 1"):
        causal_attention(q.repeat(2, 1, 1, 1), k.repeat(2, 1, 1, 1), v.repeat(2, 1, 1, 1), 0.25)
    with pytest.raises(ValueError, match="overlapping"):
        causal_attention(q, k[:, :, :1].expand(1, 2, 10, 16), v, 0.25)  # one key repeated by a zero stride


# --- batch invariance, bit for bit ----------------------------------------------------------------------------------
@needs_native
@pytest.mark.parametrize("product, dtype", [(_avx2, torch.float32), (_avx2_bf16, torch.bfloat16)], ids=["f32", "bf16"])
@pytest.mark.parametrize("in_features", [3, 7, 8, 13, 300])
def test_a_row_of_the_linear_kernel_is_the_same_bits_whatever_shares_the_call(product, dtype, in_features):
    torch.manual_seed(in_features)
    weight, bias = torch.randn(29, in_features).to(dtype), torch.randn(29)
    x = torch.randn(40, in_features)
    alone = torch.cat([product(x[i:i + 1], weight, bias) for i in range(40)])
    for rows in range(1, 41):  # every chunking of the inputs (3 per chunk, 18 per pass over the weights)
        assert torch.equal(product(x[:rows], weight, bias), alone[:rows]), rows
    assert torch.equal(at_threads(2, lambda: product(x, weight, bias)), alone)
    if dtype == torch.bfloat16:  # the widening is exact: the same bits as the fp32 kernel on the fp32 copy
        assert torch.equal(_avx2(x, weight.float(), bias), alone)


@needs_native
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("head_dim, length", [(16, 21), (12, 9), (64, 40), (8, 17)])
def test_an_attention_row_is_the_same_bits_whatever_shares_the_call(kv_dtype, head_dim, length):
    torch.manual_seed(head_dim)
    q = torch.randn(1, 6, 16, head_dim)
    k, v = (torch.randn(1, 2, length + 16, head_dim).to(kv_dtype) for _ in range(2))
    position = length + 15  # the last query of a 16-row pass over length + 16 keys
    alone = causal_attention(q[:, :, -1:], k, v, 0.3)  # a one-token step at that position
    for rows in range(1, 17):
        out = causal_attention(q[:, :, -rows:], k, v, 0.3)
        assert torch.equal(out[:, -1:], alone), rows
        # and every earlier row equals the one-token step at its own position (its keys only)
        first = position - rows + 1
        assert torch.equal(out[:, :1], causal_attention(q[:, :, -rows:][:, :, :1], k[:, :, :first + 1],
                                                        v[:, :, :first + 1], 0.3)), rows
    assert torch.equal(at_threads(2, lambda: causal_attention(q, k, v, 0.3)),
                       at_threads(1, lambda: causal_attention(q, k, v, 0.3)))
    expected = nn.functional.scaled_dot_product_attention(
        q, k.float().repeat_interleave(3, 1), v.float().repeat_interleave(3, 1), scale=0.3,
        attn_mask=torch.ones(16, length + 16, dtype=torch.bool).tril(length)).transpose(1, 2)
    torch.testing.assert_close(causal_attention(q, k, v, 0.3), expected, rtol=1e-5, atol=1e-5)



@needs_native
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("group, kv_heads", [(2, 2), (3, 1), (5, 2), (6, 2), (7, 2), (8, 1), (13, 1)])
@pytest.mark.parametrize("head_dim", [8, 12, 36, 64])
def test_query_heads_computed_together_get_each_head_computed_alone_bit_for_bit(kv_dtype, group, kv_heads, head_dim):
    """The kernel scores and weighs the query heads of a key/value head together (up to 6 at a time, a group split
    in parts where threads outnumber its tasks): the same bits as each head over its own copy of the cache (group 1),
    at 1, 2 and 5 threads, the cache strided as a longer buffer's."""
    torch.manual_seed(group * 100 + head_dim)
    heads, rows, length = group * kv_heads, 3, 19
    q = torch.randn(1, heads, rows, head_dim)
    k, v = (torch.randn(1, kv_heads, length, head_dim + 4).to(kv_dtype)[..., :head_dim] for _ in range(2))
    alone = at_threads(1, lambda: causal_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                                   0.3))
    for threads in (1, 2, 5):
        together = at_threads(threads, lambda: causal_attention(q, k, v, 0.3))
        assert torch.equal(together.view(torch.int32), alone.view(torch.int32)), threads

TOKENS = torch.randint(0, 128, (64,), generator=torch.Generator().manual_seed(5)).tolist()


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_a_position_gets_the_same_logits_in_a_step_and_in_a_verify_pass_of_any_size(dtype, threads):
    """The batch-invariant setup (runtime.linear_kernel: invariant, the default) on a tiny model: every m of 1..16,
    at several offsets, against one-token steps, bit for bit; and the same bits on 1 and 2 threads."""
    model = tiny_qwen2(vocab_size=128, hidden_size=64, seed=3, dtype=torch.float32).to(dtype)
    use_invariant_kernels(model)
    single, passes = step_and_pass_logits(CachedLM(model), TOKENS, prompt_length=20, steps=16)
    assert count_differing_rows(single, passes) == (0, count_differing_rows(single, passes)[1])
    other = at_threads(3 - threads,
                       lambda: step_and_pass_logits(CachedLM(model), TOKENS, prompt_length=20, steps=4)[0])
    assert torch.equal(other, single[:4])


@needs_native
def test_the_invariance_check_catches_a_backend_chosen_per_row_count():
    """The check above has power: torch's attention, or one product per row count as `auto` chooses them, makes
    rows differ (a one-row product on weight_major, more rows on avx2)."""
    model = tiny_qwen2(vocab_size=128, hidden_size=64, seed=3, dtype=torch.float32)
    use_invariant_kernels(model)
    for layer in model.modules():
        if isinstance(layer, BackendLinear):
            layer.table[1] = "weight_major"
    single, passes = step_and_pass_logits(CachedLM(model), TOKENS, prompt_length=20, steps=8)
    assert count_differing_rows(single, passes)[0] > 0
    model = tiny_qwen2(vocab_size=128, hidden_size=64, seed=3, dtype=torch.float32)
    use_backends(model, "avx2", max_rows=32)  # invariant products, torch's attention
    single, passes = step_and_pass_logits(CachedLM(model), TOKENS, prompt_length=20, steps=8)
    assert count_differing_rows(single, passes)[0] > 0


@needs_native
def test_the_invariant_setup_computes_the_model():
    """Same model, other summation orders: logits within float noise of torch's own layers."""
    for dtype, tolerance in ((torch.float32, 1e-3), (torch.bfloat16, 0.5)):
        reference = tiny_qwen2(vocab_size=128, hidden_size=64, seed=3, dtype=torch.float32).to(dtype)
        model = use_invariant_kernels(tiny_qwen2(vocab_size=128, hidden_size=64, seed=3, dtype=torch.float32).to(dtype))
        ids = torch.tensor([TOKENS[:40]])
        with torch.inference_mode():
            for rows in (40, 8):  # a prompt pass (SDPA, fastest products) and a decoding-sized pass (native)
                expected, got = reference(ids[:, :rows]).logits.float(), model(ids[:, :rows]).logits.float()
                assert (expected - got).abs().max() < tolerance, (dtype, rows)
        assert {type(m) for m in model.modules()} & {BackendLinear, RowAdaptiveBf16Linear}


def test_an_invariant_setup_without_native_kernels_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(kernels, "invariant_kernels_available", lambda: False)
    with pytest.raises(RuntimeError, match="linear_kernel 'invariant' needs specdec's native kernels"):
        use_invariant_kernels(tiny_qwen2(vocab_size=16, hidden_size=16, dtype=torch.float32))


def test_an_edited_kernel_source_is_noticed(tmp_path, monkeypatch):
    from specdec.native import build as native_build

    if kernels._linear is None:
        pytest.skip("not built")
    edited = tmp_path / "_linear.c"
    edited.write_text(native_build.source_path("_linear").read_text() + "\n/* edited */\n")
    monkeypatch.setattr(native_build, "source_path", lambda name: edited if name == "_linear" else
                        native_build.Path(native_build.__file__).with_name(f"{name}.c"))
    assert stale_native_modules() == ["_linear"]


def test_backends_accept_the_layer_name_and_ignore_it_where_torch_runs_them():
    x, w = torch.randn(2, 12), _weight()
    for name in ("linear", "weight_major"):
        torch.testing.assert_close(BACKENDS[name](x, w, None, layer="x"), x @ w.t())


def test_ci_insists_on_the_native_build():
    """.ci/run fails when an x86 machine with a compiler did not build the modules (not only this test)."""
    script = open(".ci/run").read()
    assert "specdec.native.check" in script
    result = subprocess.run([sys.executable, "-m", "specdec.native.check"], capture_output=True, text=True)
    assert result.returncode == (0 if invariant_kernels_available() or not X86_WITH_COMPILER else 1), result.stderr


# --- the lean forward's row operations (specdec/native/_rowops.c) -----------------------------------------------------
from specdec.native import rowops  # noqa: E402


@pytest.mark.skipif(not rowops.available(), reason="specdec.native._rowops not available here")
def test_row_operations_compute_torchs_and_a_row_is_the_same_bits_whatever_shares_the_call():
    torch.manual_seed(0)
    x, weight = torch.randn(40, 1536) * 3, torch.randn(1536)
    expected = nn.functional.rms_norm(x, (1536,), weight, 1e-6)
    normed = rowops.rms_norm(x, weight, 1e-6)
    torch.testing.assert_close(normed, expected, rtol=1e-5, atol=1e-5)
    gate_up = torch.randn(40, 2 * 896) * 4
    gate, up = gate_up[:, :896], gate_up[:, 896:]
    product = rowops.silu_mul(gate, up)
    torch.testing.assert_close(product, nn.functional.silu(gate) * up, rtol=1e-5, atol=1e-5)
    for rows in (1, 3, 17):
        assert torch.equal(rowops.rms_norm(x[5:5 + rows], weight, 1e-6), normed[5:5 + rows])
        assert torch.equal(rowops.silu_mul(gate[5:5 + rows], up[5:5 + rows]), product[5:5 + rows])


@pytest.mark.skipif(not rowops.available(), reason="specdec.native._rowops not available here")
@pytest.mark.parametrize("call, error", [
    (lambda: rowops.rms_norm(torch.randn(2, 16), torch.randn(8), 1e-6), "\\(rows, 8\\)"),
    (lambda: rowops.rms_norm(torch.randn(2, 12), torch.randn(12), 1e-6), "multiple of 8"),
    (lambda: rowops.rms_norm(torch.randn(2, 16).double(), torch.randn(16), 1e-6), "float32"),
    (lambda: rowops.rms_norm(torch.randn(2, 16), torch.randn(16, 1), 1e-6), "1-d vector"),
    (lambda: rowops.silu_mul(torch.randn(2, 16), torch.randn(2, 8)), "\\(rows, 16\\)"),
    (lambda: rowops.silu_mul(torch.randn(4, 16)[::2], torch.randn(2, 16)), "one shape and row stride"),
    (lambda: rowops.silu_mul(torch.randn(2, 32)[:, ::2], torch.randn(2, 32)[:, ::2]), "contiguous rows"),
])
def test_row_operations_refuse_what_the_kernel_cannot_take(call, error):
    with pytest.raises((ValueError, RuntimeError), match=error):
        call()


def test_a_bf16_model_given_fp32_tables_is_a_clear_error():
    from specdec.fp32.kernels import apply_bf16_tables, use_row_adaptive_bf16_linear

    model = use_row_adaptive_bf16_linear(tiny_qwen2(vocab_size=64, hidden_size=32, seed=0).to(torch.bfloat16))
    with pytest.raises(ValueError, match="needs bf16 kernel tables"):
        apply_bf16_tables(model, {"32x32": {1: "avx2", 2: "weight_major"}})
