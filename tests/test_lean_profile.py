"""The cost model's profiles in the gguf regime: a lean session's per-layer times (measured inside the fused native
call, or around each layer of the Python forward) with the file's own bytes per layer and head, and the fit over two
tiny GGUF widths. Timing the parts must not change a pass: logits, hidden states and cache keep extend's bits."""

import pandas as pd
import pytest
import torch

from specdec.gguf import fused_layers
from specdec.gguf.model import read_gguf
from specdec.gguf.lean import LeanLM
from specdec.study.cost.model import ModelShape, fit_cost_model, profiled_shapes
from specdec.study.cost.profiling import profile_models
from specdec.testing import tiny_gguf

TOKENS = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(5)).tolist()
FORWARDS = [True, False] if fused_layers.available() else [False]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return {"narrow": read_gguf(tiny_gguf(root / "narrow.gguf", layers=3)),
            "wide": read_gguf(tiny_gguf(root / "wide.gguf", layers=2, hidden=512, ffn=1024, heads=8))}


@pytest.mark.parametrize("fused", FORWARDS)
@pytest.mark.parametrize("rows", [1, 4])
def test_a_timed_pass_gives_extends_bits_and_a_time_per_layer(files, fused, rows):
    timed, plain = (LeanLM(files["narrow"], max_length=64, fused=fused) for _ in range(2))
    for session in (timed, plain):
        session.extend(TOKENS[:20], 1)
    logits, times = timed.timed_extend(TOKENS[20:20 + rows], rows)
    assert torch.equal(logits, plain.extend(TOKENS[20:20 + rows], rows))
    assert torch.equal(timed.last_hidden, plain.last_hidden) and torch.equal(timed.keys, plain.keys)
    assert set(times) == {"embedding", "layers", "norm", "lm_head"} and len(times["layers"]) == 3
    assert all(seconds > 0 for seconds in [*times["layers"], times["norm"], times["lm_head"]])


@pytest.mark.skipif(not fused_layers.available(), reason="specdec.native._layers not built here")
@pytest.mark.parametrize("bad", [torch.zeros(3), torch.zeros(2, dtype=torch.float64),
                                 torch.zeros(6, dtype=torch.float64)[::2], [0.0, 0.0, 0.0]])
def test_a_wrong_layer_seconds_vector_is_refused_before_c(files, bad):
    session = LeanLM(files["narrow"], max_length=32)
    with pytest.raises(ValueError, match="layer_seconds must be a contiguous CPU float64 vector of 3 values"):
        session._fused.forward(torch.randn(1, 256), 0, bad)


def test_lean_profiles_carry_the_files_bytes_and_fit_two_widths(files):
    sessions = {name: LeanLM(model, max_length=40) for name, model in files.items()}
    tables = profile_models(sessions, context_length=16, positions=(1, 2, 3), repeats=3)
    narrow, model = tables["narrow"], files["narrow"]
    assert len(narrow) == (3 + 4) * 3 * 3 and (narrow["seconds"] > 0).all()
    layers = narrow[narrow.component == "layer"]
    for i in range(3):
        assert (layers[layers.layer == i]["param_bytes"] == model.layer_bytes(i)).all()
    assert (narrow[narrow.component == "lm_head"]["param_bytes"] == model.output.nbytes).all()
    assert (narrow[narrow.component == "forward"]["param_bytes"] == model.step_bytes()).all()
    # the shape's bytes are the file's: mean layer bytes and the head's (its type is not the layers')
    shape = profiled_shapes(pd.concat(tables.values()))["narrow"]
    mean_layer = sum(model.layer_bytes(i) for i in range(3)) / 3
    assert shape.layer_bytes == pytest.approx(mean_layer) and shape.head_bytes == pytest.approx(model.output.nbytes)
    assert shape.dtype_bytes < 1 and shape.head_dtype_bytes != shape.dtype_bytes
    sums = narrow[narrow.component != "forward"].groupby(["m", "repeat"])["seconds"].sum()
    assert (sums <= narrow[narrow.component == "forward"].set_index(["m", "repeat"])["seconds"]).all()
    fit = fit_cost_model(pd.concat(tables.values()), n_boot=50)
    assert fit.terms["estimate"].notna().all() and set(fit.verify["model"]) == {"narrow", "wide"}


def test_a_profile_that_needs_more_positions_than_the_cache_is_refused(files):
    with pytest.raises(ValueError, match="cache holds 16 positions: profiling needs 19"):
        profile_models({"narrow": LeanLM(files["narrow"], max_length=16)}, context_length=16, positions=(1, 3),
                       repeats=1)


def test_shapes_from_fp32_rows_keep_whole_bytes_and_gguf_rows_their_head():
    fp32 = pd.DataFrame([{"n_layers": 2, "hidden_size": 8, "intermediate_size": 16, "vocab_size": 10,
                          "dtype_bytes": 4.0, "kv_dim": 4}])
    shape = ModelShape.from_row(next(fp32.itertuples()))
    assert shape.dtype_bytes == 4 and isinstance(shape.dtype_bytes, int) and shape.head_bytes == 10 * 8 * 4
    gguf = fp32.assign(dtype_bytes=0.6, head_dtype_bytes=0.8)
    shape = ModelShape.from_row(next(gguf.itertuples()))
    assert shape.head_bytes == pytest.approx(10 * 8 * 0.8) and shape.layer_bytes == pytest.approx(
        shape.layer_params * 0.6)
