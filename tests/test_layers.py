"""The fused layers (specdec/gguf/fused_layers.py, specdec/native/_layers.c): every decoder layer of a decoding step or
a verify pass in one native call gives the Python forward's bits (logits, last hidden states, the KV cache) for every
tensor type, product layout (q|k|v in 1, 2 or 3 runs; gate|up in 1 or 2), row count 1..16 and thread count; and every
call is checked before it enters C: a wrong tensor or a corrupt plan row is a clear error, never a read out of
bounds. Tiny random GGUF files written by the test."""

import pytest
import torch

from specdec.gguf import fused_layers
from specdec.gguf.model import read_gguf
from specdec.gguf.lean import LeanLM
from specdec.testing import DRAFT_TYPES, tiny_gguf

pytestmark = pytest.mark.skipif(not fused_layers.available(), reason="specdec.native._layers not built here")

TOKENS = torch.randint(0, 256, (80,), generator=torch.Generator().manual_seed(11)).tolist()
# the target's mix (one layer's q|k|v one product, the other's two), the draft's, and plain floats in three q|k|v runs
# (F16, F32, F16) and two gate|up runs (F16, F32)
TYPE_SETS = {
    "target": {"blk.1.attn_v": "Q4_K", "blk.0.ffn_down": "Q4_K"},
    "draft": DRAFT_TYPES,
    "floats": {"attn_q": "F16", "attn_k": "F32", "attn_v": "F16", "ffn_gate": "F16", "ffn_up": "F32",
               "attn_output": "F16", "ffn_down": "F32"},
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return {name: read_gguf(tiny_gguf(root / f"{name}.gguf", types=types)) for name, types in TYPE_SETS.items()}


def runs(model):
    layer = model.layers[0]
    return len(layer.qkv), len(layer.gate_up)


def test_the_files_cover_every_product_layout(models):
    layouts = {runs(model) for model in models.values()} | {(len(w.qkv), len(w.gate_up))
                                                             for w in models["target"].layers}
    assert {(1, 1), (2, 1), (3, 2)} <= layouts


@pytest.mark.parametrize("kernel_name", ["avx2", "avx512-vnni-256", "avx512-vnni"])
@pytest.mark.parametrize("file", ["target", "draft"])
def test_a_model_in_either_layout_gives_the_same_bits(tmp_path, monkeypatch, kernel_name, file, threads):
    """The target's Q4_K and Q6_K matrices, and the draft's Q5_0 and Q8_0 ones, loaded in the file's rows and in
    groups of 16 rows (forced here whatever the CPU, so that the AVX2 path, which unpacks each group, is covered too):
    the same logits, step after step, in one-token steps and a verify pass, fused and in Python."""
    from specdec.gguf import quant

    if kernel_name not in quant.kernels():
        pytest.skip(f"this CPU does not run the {kernel_name} product kernel")
    path = tiny_gguf(tmp_path / f"{file}.gguf", types=TYPE_SETS[file])
    monkeypatch.setattr(quant, "preferred_layout",
                        lambda qtype, rows: "r16" if qtype in quant.R16_BLOCK_BYTES and rows % 16 == 0 else "rows")
    grouped = read_gguf(path)
    monkeypatch.setattr(quant, "preferred_layout", lambda qtype, rows: "rows")
    plain = read_gguf(path)
    assert grouped.layers[1].q.layout == grouped.layers[0].v.layout == grouped.output.layout == "r16"
    assert plain.layers[1].q.layout == plain.output.layout == "rows"
    with quant.use_kernel(kernel_name):
        for fused in (True, False):
            outs = []
            for model in (grouped, plain):
                session = LeanLM(model, max_length=128, fused=fused)
                session.extend(TOKENS[:40], 1)
                steps = [session.extend([t], 1) for t in TOKENS[40:44]]
                verify = session.extend(TOKENS[44:50], 6)
                outs.append([*steps, verify])
            assert all(torch.equal(a, b) for a, b in zip(*outs)), fused


def state(session, logits):
    """What a pass leaves: its logits, the last hidden states and the KV cache up to the session's length."""
    end = session.length
    return logits, session.last_hidden, session.keys[:, :, :end], session.values[:, :, :end]


def identical(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("name, layers", [(name, None) for name in TYPE_SETS] + [("target", 1)])
def test_fused_layers_give_the_python_forwards_bits_for_every_row_count(models, name, layers, threads):
    fused, python = (LeanLM(models[name], layers=layers, max_length=128, fused=f) for f in (True, False))
    assert fused._fused is not None and python._fused is None
    for session in (fused, python):
        session.extend(TOKENS[:40], 1)  # a prompt pass: the Python forward in both
    for rows in range(1, 17):
        block = TOKENS[40:40 + rows]
        assert identical(state(fused, fused.extend(block, rows)), state(python, python.extend(block, rows))), \
            (name, rows)
        fused.crop(40)
        python.crop(40)


def test_the_comparison_sees_a_small_difference(models):
    """The check above has power: one value bias 0.001 off (read through the plan's address; a value's last bit
    can round away in its sum) changes the fused session's state."""
    model = models["target"]
    fused, python = LeanLM(model, max_length=64), LeanLM(model, max_length=64, fused=False)
    bias = model.layers[0].v_bias
    original = bias[3].clone()
    try:
        bias[3] += 1e-3
        shifted = state(fused, fused.extend(TOKENS[:3], 3))
    finally:
        bias[3] = original
    expected = state(python, python.extend(TOKENS[:3], 3))
    assert not identical(shifted, expected)
    fused.reset()
    assert identical(state(fused, fused.extend(TOKENS[:3], 3)), expected)  # the bias restored, the bits agree


def plan_and_call(model, rows=2):
    session = LeanLM(model, max_length=32)
    hidden = torch.randn(rows, model.config.hidden)
    return session._fused, hidden


@pytest.mark.parametrize("bad, error", [
    (lambda h: h.double(), "contiguous CPU float32 rows of 256 values"),
    (lambda h: h[:, :128], "contiguous CPU float32 rows of 256 values"),
    (lambda h: h.t().contiguous().t(), "contiguous CPU float32 rows"),
    (lambda h: h[0], "contiguous CPU float32 rows"),
])
def test_a_wrong_hidden_tensor_is_refused_before_c(models, bad, error):
    fused, hidden = plan_and_call(models["draft"])
    with pytest.raises(ValueError, match=error):
        fused.forward(bad(hidden), 0)


@pytest.mark.parametrize("start", [31, -1, 30.0])
def test_positions_outside_the_cache_are_refused(models, start):
    fused, hidden = plan_and_call(models["draft"])
    with pytest.raises(ValueError, match="outside the cache's 32"):
        fused.forward(hidden, start)


@pytest.mark.parametrize("field, value, error", [
    (3, 99, "unknown weight type code"),               # the first q|k|v run's type
    (5, 7, "bytes per row do not match"),               # its bytes per row
    (6, 16, "do not add up to \\(heads \\+ 2 kv_heads\\) x head_dim"),  # its output rows
    (2, 0, "1..3 runs"),                                # no q|k|v run
    (0, 0, "a null address"),                           # the attention norm's address
    (19, 0, "weight address is null"),                  # the output projection's address
])
def test_a_corrupt_plan_row_is_refused_by_the_native_check(models, field, value, error):
    fused, hidden = plan_and_call(models["draft"])
    fused.plan[1, field] = value
    with pytest.raises(ValueError, match=f"layer plan row 1: .*{error}"):
        fused.forward(hidden, 0)


def test_a_grouped_run_whose_outputs_are_not_whole_groups_is_refused(models):
    from specdec.native import _layers

    fused, hidden = plan_and_call(models["target"])
    fused.plan[1, 3] = _layers.type_codes()["Q4_K_R16"]  # the first q|k|v run as Q4_K in groups of 16 rows ...
    fused.plan[1, 5] = 148  # ... of one block a row (hidden 256) ...
    fused.plan[1, 6] = 500  # ... over 500 outputs
    with pytest.raises(ValueError,
                       match="layer plan row 1: a grouped product's outputs are not whole groups of 16 rows"):
        fused.forward(hidden, 0)


def test_a_plan_of_another_type_or_width_is_refused_before_c(models):
    fused, hidden = plan_and_call(models["draft"])
    plan = fused.plan
    for bad in (plan.int(), plan[:, :-1].contiguous(), plan.t()):
        fused.plan = bad
        with pytest.raises(ValueError, match="the layer plan must be a contiguous int64"):
            fused.forward(hidden, 0)


def test_caches_of_another_shape_are_refused_when_the_plan_is_made(models):
    model = models["draft"]
    session = LeanLM(model, max_length=16)
    c = model.config
    with pytest.raises(ValueError, match="keys cache must be a contiguous CPU float32 tensor"):
        fused_layers.FusedLayers(c, model.layers, session.keys[:1], session.values, session._cos, session._sin)
    with pytest.raises(ValueError, match="rotary cos table"):
        fused_layers.FusedLayers(c, model.layers, session.keys, session.values, session._cos[:8], session._sin)
