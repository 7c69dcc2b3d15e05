"""The quantized regime: a GGUF file read as it is (specdec/gguf/model.py) and run by the lean forward
(specdec/gguf/lean.py) as a session: refused by name where it cannot run, the same model as Hugging Face's on the
dequantised weights, the session verbs, batch invariance bit for bit, and greedy speculative decoding equal to greedy
decoding with lean targets and drafts. Tiny random GGUF files written by the tests; the real files in the slow tier."""

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from specdec.native import attention

from specdec.gguf import fused_layers, lean, quant
from specdec.decode import generate_baseline, generate_speculative
from specdec.drafts import HybridDraft, ModelDraft, PromptLookupDraft
from specdec.gguf.model import GGUFModelError, read_gguf
from specdec.gguf.lean import ContextLengthError, LeanLM
from specdec.gguf.quant import UnsupportedTensorType
from specdec.testing import (
    DRAFT_TYPES,
    at_threads,
    count_differing_rows,
    hf_reference,
    step_and_pass_logits,
    tiny_gguf,
)

REAL = Path(__file__).resolve().parents[1] / "resources"
needs_product = pytest.mark.skipif(not quant.available(),
                                   reason="specdec.native._quant (the quantized product) not built")
needs_invariant = pytest.mark.skipif(not (quant.available() and attention.available()),
                                     reason="the native product and attention are not both available")
TOKENS = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(5)).tolist()
# every tensor type the engine runs: the target's mix (the 1.5B file's, with Q4_K and Q6_K alternating across layers
# for attn_v and ffn_down, so one layer's q|k|v is one product and the other's two), the draft's, plain floats, and a
# file whose head is its embedding
TYPE_SETS = {
    "target": {"blk.1.attn_v": "Q4_K", "blk.0.ffn_down": "Q4_K"},
    "draft": DRAFT_TYPES,
    "floats": {"attn_q": "F16", "attn_k": "F16", "attn_v": "F32", "ffn_up": "F32", "output": "F16"},
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return {name: tiny_gguf(root / f"{name}.gguf", types=types) for name, types in TYPE_SETS.items()} | {
        "tied": tiny_gguf(root / "tied.gguf", types=DRAFT_TYPES, tied=True),
        # a second layer ~30x smaller than the first: the first layer alone is a draft that is often right
        "deep": tiny_gguf(root / "deep.gguf", types=TYPE_SETS["target"], norm_scale=(0.1, 0.003))}


@pytest.fixture(scope="module")
def models(files):
    return {name: read_gguf(path) for name, path in files.items()}


def exact_products(monkeypatch):
    """Products on the dequantised fp32 weights: the lean forward then differs from Hugging Face's by summation
    order only, so a structural mistake (rotary, grouped heads, the cache, a bias) cannot hide in quantisation noise.
    Sessions made meanwhile run the Python forward for every pass (the fused layers' products are native; that they
    give the Python forward's bits is tests/test_layers.py's)."""
    monkeypatch.setattr(fused_layers, "available", lambda: False)
    cache = {}

    def matmul(self, x, bias=None):
        if id(self) not in cache:
            cache[id(self)] = self.dequantize_rows()
        return F.linear(x, cache[id(self)], bias)

    monkeypatch.setattr(quant.QuantMatrix, "matmul", matmul)


def hf_logits(model, tokens):
    hf = hf_reference(model)
    with torch.inference_mode():
        return hf(torch.tensor([tokens])).logits[0]


def lean_logits(session, tokens, pieces):
    """Logits of every position, fed in pieces of these sizes (the rest one token at a time)."""
    session.reset()
    out, start = [], 0
    for size in list(pieces) + [1] * (len(tokens) - sum(pieces)):
        out.append(session.extend(tokens[start:start + size], size))
        start += size
    return torch.cat(out)


# --- the loader ------------------------------------------------------------------------------------------------------
def test_the_loader_reads_the_files_configuration_and_keeps_every_weight_as_the_file_holds_it(files, models):
    from gguf import GGUFReader

    model = models["target"]
    c = model.config
    assert (c.layers, c.hidden, c.ffn, c.heads, c.kv_heads, c.head_dim, c.vocab_size) == (2, 256, 512, 4, 2, 64, 256)
    assert (c.rope_theta, c.eos_token_ids) == (1e6, frozenset({1})) and c.rms_eps == pytest.approx(1e-6)
    tensors = {t.name: t for t in GGUFReader(files["target"]).tensors}
    layer = model.layers[1]
    for matrix in (layer.q, layer.v, layer.down, model.output, model.embedding):
        assert matrix.raw.dtype == torch.uint8
        # in the layout the product kernel runs fastest (Q4_K in groups of 16 rows on AVX-512), every byte kept
        multiplied = matrix is not model.embedding or model.output is model.embedding
        assert matrix.layout == (quant.preferred_layout(matrix.qtype, matrix.out_features) if multiplied else "rows")
        file_bytes = np.asarray(tensors[matrix.name].data).view(np.uint8)
        assert np.array_equal(matrix.in_layout("rows").raw.numpy(), file_bytes), matrix.name
        assert matrix.qtype == tensors[matrix.name].tensor_type.name
    # the bandwidth floor counts every byte a step reads: all tensors but the embedding, as the engine holds them
    # (Q4_K in groups of 16 rows: 148 bytes a block instead of 144)
    held = {m.name: m for w in model.layers for m in (w.q, w.k, w.v, w.o, w.gate, w.up, w.down)}
    held[model.output.name] = model.output

    def step_bytes(name, t):
        m = held.get(name)
        grouped = m is not None and m.layout == "r16"
        return (int(t.n_bytes) // quant.BLOCKS[m.qtype][1] * quant.R16_BLOCK_BYTES[m.qtype] if grouped
                else int(t.n_bytes))
    assert model.step_bytes() == sum(step_bytes(name, t) for name, t in tensors.items() if name != "token_embd.weight")
    assert model.step_bytes(1) < model.step_bytes()
    # q|k|v as one product where the three share a type (layer 1: Q4_K), two where v differs (layer 0: Q6_K)
    assert [len(w.qkv) for w in model.layers] == [2, 1] and all(len(w.gate_up) == 1 for w in model.layers)
    assert [m.out_features for m, _ in model.layers[0].qkv] == [256 + 128, 128]


def test_a_tied_file_uses_its_embedding_as_the_head(models):
    assert models["tied"].tied and models["tied"].output is models["tied"].embedding
    assert not models["draft"].tied


def test_a_tensor_type_the_engine_does_not_run_is_refused_by_name_before_any_work(tmp_path, monkeypatch):
    from specdec.gguf import model as gguf_model

    path = tiny_gguf(tmp_path / "q4_0.gguf", types={"blk.1.ffn_up": "Q4_0", "attn_k": "Q5_1"})
    monkeypatch.setattr(gguf_model, "_matrices", lambda *a: pytest.fail("bytes copied before the checks"))
    named = (r"3 tensors .*blk\.0\.attn_k\.weight \(Q5_1\).*blk\.1\.attn_k\.weight \(Q5_1\)"
             r".*blk\.1\.ffn_up\.weight \(Q4_0\)")
    with pytest.raises(UnsupportedTensorType, match=named):
        read_gguf(path)
    assert not set(quant.SUPPORTED_TYPES) & {"Q4_0", "Q5_1"}


def test_another_architecture_is_refused(tmp_path):
    with pytest.raises(GGUFModelError, match="architecture 'llama'; the lean engine runs qwen2"):
        read_gguf(tiny_gguf(tmp_path / "llama.gguf", architecture="llama"))


@pytest.mark.parametrize("broken, error", [
    (dict(drop=("blk.1.attn_k.bias",)), r"missing tensors: blk\.1\.attn_k\.bias"),
    (dict(metadata={"feed_forward_length": 1024}), r"blk\.0\.ffn_gate\.weight is \(512, 256\), metadata says \(1024"),
    (dict(metadata={"attention.head_count_kv": 4}), r"blk\.0\.attn_k\.weight is \(128, 256\), metadata says \(256"),
    (dict(metadata={"block_count": 1}), r"tensors the qwen2 forward does not use: blk\.1\."),
    (dict(metadata={"attention.head_count": 3}), "must split into 3 heads"),
    (dict(metadata={"vocab_size": 300}), "vocab_size 300 differs from token_embd.weight's 256 rows"),
], ids=["missing", "ffn", "kv_heads", "extra", "heads", "vocab"])
def test_a_file_that_disagrees_with_its_metadata_is_refused_by_name(tmp_path, broken, error):
    with pytest.raises(GGUFModelError, match=error):
        read_gguf(tiny_gguf(tmp_path / "broken.gguf", **broken))


def test_missing_metadata_is_named(tmp_path):
    path = tiny_gguf(tmp_path / "no_eps.gguf", metadata={"attention.layer_norm_rms_epsilon": None})
    with pytest.raises(GGUFModelError, match="'qwen2.attention.layer_norm_rms_epsilon' is missing"):
        read_gguf(path)


def test_the_header_and_memory_map_read_what_the_gguf_package_reads_bit_for_bit(tmp_path):
    """read_gguf parses the header itself and copies each tensor from its offset: on a file holding every type the
    engine runs, every tensor's bytes (matrices raw, vectors as fp32) and the configuration equal those the gguf
    package's reader gives, and so does the header's table (offsets, byte sizes)."""
    from gguf import GGUFReader

    from specdec.gguf import model as gguf_model
    from specdec.gguf.header import read_header

    types = {"token_embd": "Q8_0", "attn_q": "Q4_K", "attn_k": "Q5_0", "attn_v": "F16", "attn_output": "F32",
             "ffn_gate": "Q6_K", "ffn_up": "Q4_K", "ffn_down": "Q5_0", "output": "F16", "blk.1.attn_v": "Q8_0"}
    path = tiny_gguf(tmp_path / "every-type.gguf", types=types)
    model, reader = read_gguf(path), GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    assert {t.tensor_type.name for t in reader.tensors} == set(quant.SUPPORTED_TYPES)

    header = read_header(path, string_arrays=())
    assert list(header.tensors) == list(tensors)
    for name, t in header.tensors.items():
        assert (t.offset, t.nbytes, t.end) == (tensors[name].data_offset, tensors[name].n_bytes,
                                               tensors[name].data_offset + tensors[name].n_bytes), name

    metadata = {key: field.contents() for key, field in reader.fields.items()}
    expected = gguf_model._config(gguf_model._Metadata(metadata, path),
                                  vocab_size=int(tensors["token_embd.weight"].shape[1]))
    assert model.config == expected
    assert all(type(getattr(model.config, k)) is type(getattr(expected, k)) for k in expected.__dataclass_fields__)
    assert all(type(e) is int for e in model.config.eos_token_ids)

    seen = {}
    for matrix in [model.embedding, model.output] + [getattr(w, m) for w in model.layers
                                                     for m in ("q", "k", "v", "o", "gate", "up", "down")]:
        seen[matrix.name] = matrix.in_layout("rows").raw.numpy().tobytes()  # the file's bytes, whatever the layout
        assert matrix.qtype == tensors[matrix.name].tensor_type.name, matrix.name
    vectors = {"output_norm.weight": model.output_norm}
    for i, w in enumerate(model.layers):
        vectors.update({f"blk.{i}.attn_norm.weight": w.attn_norm, f"blk.{i}.ffn_norm.weight": w.ffn_norm,
                        f"blk.{i}.attn_q.bias": w.q_bias, f"blk.{i}.attn_k.bias": w.k_bias,
                        f"blk.{i}.attn_v.bias": w.v_bias})
    seen.update({name: v.numpy().tobytes() for name, v in vectors.items()})
    assert set(seen) == set(tensors)  # every tensor of the file
    for name, t in tensors.items():
        data = np.asarray(t.data)
        want = (np.array(data, dtype=np.float32) if name in vectors else data.view(np.uint8)).tobytes()
        assert seen[name] == want, name


def test_a_file_whose_tensor_data_is_cut_short_is_refused_naming_the_tensors(tmp_path, monkeypatch):
    from specdec.gguf import model as gguf_model
    from specdec.gguf.header import GGUFFileError, read_header

    path = tiny_gguf(tmp_path / "whole.gguf")
    table, raw = read_header(path, string_arrays=()).tensors, path.read_bytes()
    monkeypatch.setattr(gguf_model, "_matrices", lambda *a: pytest.fail("bytes copied before the checks"))
    cut = tmp_path / "cut.gguf"
    last = list(table)[-1]
    cut.write_bytes(raw[:table[last].end - 1])  # one byte short of the last tensor
    with pytest.raises(GGUFFileError, match=rf"cut\.gguf is truncated \(\d+ bytes\): the data of 1 tensors runs past "
                                            rf"its end: {last.replace('.', '[.]')} \(bytes \d+\.\.\d+\)$"):
        read_gguf(cut)
    down = table["blk.1.ffn_down.weight"]
    cut.write_bytes(raw[:down.offset + 10])  # inside a matrix: it and every tensor after it
    after = list(table)[list(table).index("blk.1.ffn_down.weight"):]
    with pytest.raises(GGUFFileError, match=rf"the data of {len(after)} tensors runs past its end: "
                                            rf"blk\.1\.ffn_down\.weight \(bytes {down.offset}\.\.{down.end}\)"):
        read_gguf(cut)


# --- the same model as Hugging Face's ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["target", "draft", "floats", "tied"])
def test_the_lean_forward_computes_hugging_faces_qwen2_on_the_dequantised_weights(models, name, monkeypatch):
    """With exact products, to float noise: a prompt pass (torch's attention), a 40-token catch-up after a cached
    prefix (torch's attention with the causal offset), verify-sized passes and steps (the native attention)."""
    exact_products(monkeypatch)
    model = models[name]
    expected = hf_logits(model, TOKENS)
    session = LeanLM(model)
    for pieces in ([64], [40, 24], [5, 40, 3, 7, 1, 4], [3, 16]):
        got = lean_logits(session, TOKENS, pieces)
        assert (got - expected).abs().max() < 1e-4 * expected.abs().max(), (name, pieces)


def relative_error(got, expected):
    """Per position: the logits' error as a fraction of their size (root mean square over the vocabulary)."""
    return (got - expected).norm(dim=-1) / expected.norm(dim=-1)


@needs_product
@pytest.mark.parametrize("name", ["target", "draft", "floats"])
def test_with_8_bit_activations_the_lean_forward_stays_close_to_the_model(models, name):
    """The native product rounds each activation row to 8 bits (as llama.cpp does), about 0.5-0.9% per product on
    its own: measured over seeds 0-2, the logits' relative error has a median of 0.5-0.8% (target types), 2.3%
    (draft types), 1% (plain floats), at most 6%, and the top token agrees on 97-100% of positions."""
    model = models[name]
    expected = hf_logits(model, TOKENS)
    got = lean_logits(LeanLM(model), TOKENS, [40])
    error = relative_error(got, expected)
    assert error.median() < 0.05 and error.max() < 0.15, (error.median(), error.max())
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.9


def test_last_hidden_is_the_last_layers_output_before_the_final_norm(models, monkeypatch):
    exact_products(monkeypatch)
    model = models["draft"]
    hf = hf_reference(model)
    captured = {}
    hf.model.layers[-1].register_forward_hook(lambda module, args, out: captured.update(h=out[0] if isinstance(
        out, tuple) else out))
    with torch.inference_mode():
        hf(torch.tensor([TOKENS[:12]]))
    session = LeanLM(model)
    session.extend(TOKENS[:9], 1)
    logits = session.extend(TOKENS[9:12], 2)
    assert session.last_hidden.shape == (3, model.config.hidden)
    torch.testing.assert_close(session.last_hidden, captured["h"][0, 9:12], rtol=1e-4, atol=1e-4)
    head = F.linear(F.rms_norm(session.last_hidden[1:], (model.config.hidden,), model.output_norm,
                               model.config.rms_eps), model.output.dequantize_rows())
    torch.testing.assert_close(logits, head, rtol=1e-5, atol=1e-5)


def test_kept_features_are_the_normed_hidden_states_and_change_no_logit(models):
    """keep_hidden_states (a feature head's input): every position's final hidden state after the final norm, kept
    through crops; the logits stay the same bits as a session that keeps none."""
    model = models["draft"]
    plain, keeping = LeanLM(model), LeanLM(model)
    keeping.keep_hidden_states()
    for session in (plain, keeping):
        session.extend(TOKENS[:7], 1)
        session.extend(TOKENS[7:10], 3)
        session.crop(8)
    expected_last = plain.extend(TOKENS[8:12], 2)
    got_last = keeping.extend(TOKENS[8:12], 2)
    assert torch.equal(got_last, expected_last)
    features = keeping.hidden_states(0, 12)
    assert features.shape == (12, model.config.hidden)
    normed = F.rms_norm(keeping.last_hidden, (model.config.hidden,), model.output_norm, model.config.rms_eps)
    torch.testing.assert_close(features[8:], normed, rtol=1e-5, atol=1e-5)
    with pytest.raises(IndexError, match="positions 0..11 are held"):
        keeping.hidden_states(10, 13)


def test_a_truncated_session_is_the_file_with_fewer_layers(tmp_path, monkeypatch):
    exact_products(monkeypatch)  # tiny_gguf draws each tensor from its name: the first layer is the same tensors
    two, one = read_gguf(tiny_gguf(tmp_path / "two.gguf")), read_gguf(tiny_gguf(tmp_path / "one.gguf", layers=1))
    cut = LeanLM(two, layers=1)
    assert torch.equal(lean_logits(cut, TOKENS[:20], [12]), lean_logits(LeanLM(one), TOKENS[:20], [12]))
    assert cut.keys.shape[0] == 1 and cut.step_bytes() == one.step_bytes()
    with pytest.raises(ValueError, match="layers must be an integer in 1..2"):
        LeanLM(two, layers=3)


# --- the session verbs ---------------------------------------------------------------------------------------------
@needs_product
def test_extending_in_pieces_computes_what_extending_at_once_does(models):
    session = LeanLM(models["target"])
    at_once = lean_logits(session, TOKENS[:48], [48])  # torch's attention
    for pieces in ([20, 28], [7, 33, 8], [1] * 48):
        got = lean_logits(session, TOKENS[:48], pieces)
        assert (got - at_once).abs().max() < 1e-3 * at_once.abs().max(), pieces
        assert torch.equal(got.argmax(-1), at_once.argmax(-1))


@needs_invariant
def test_pieces_of_up_to_32_rows_give_the_same_bits_as_one_token_steps(models):
    session = LeanLM(models["target"])
    steps = lean_logits(session, TOKENS, [])
    for pieces in ([32, 32], [5, 17, 1, 32, 9], [2] * 32, [16, 16, 16, 16]):
        assert torch.equal(lean_logits(session, TOKENS, pieces), steps), pieces


@needs_product
def test_crop_then_extend_is_a_fresh_session(models):
    session = LeanLM(models["draft"])
    session.extend(TOKENS[:30], 1)
    session.extend(TOKENS[30:36], 6)  # a rejected block's positions, overwritten by what follows the crop
    session.crop(30)
    assert session.length == 30
    cropped = session.extend(TOKENS[40:45], 5)
    fresh = LeanLM(models["draft"])
    fresh.extend(TOKENS[:30], 1)
    assert torch.equal(cropped, fresh.extend(TOKENS[40:45], 5))
    session.crop(0)
    assert torch.equal(session.extend(TOKENS[:30], 2), LeanLM(models["draft"]).extend(TOKENS[:30], 2))
    with pytest.raises(ValueError, match="cannot crop to 31: the cache holds 30 tokens"):
        session.crop(31)


@needs_product
def test_reset_starts_a_new_sequence(models):
    session = LeanLM(models["draft"])
    first = session.extend(TOKENS[:10], 3)
    session.extend(TOKENS[10:20], 1)
    session.reset()
    assert session.length == 0 and session.last_hidden is None
    assert torch.equal(session.extend(TOKENS[:10], 3), first)


@needs_product
def test_a_pass_past_the_cache_is_a_clear_error_that_leaves_the_session_usable(models):
    session = LeanLM(models["draft"], max_length=16)
    session.extend(TOKENS[:10], 1)
    with pytest.raises(ContextLengthError, match="17 positions exceed this session's KV cache of max_length 16"):
        session.extend(TOKENS[10:17], 1)
    assert session.length == 10
    fresh = LeanLM(models["draft"], max_length=16)
    fresh.extend(TOKENS[:10], 1)
    assert torch.equal(session.extend(TOKENS[10:16], 6), fresh.extend(TOKENS[10:16], 6))


def test_the_session_refuses_what_it_cannot_compute(models):
    session = LeanLM(models["draft"])
    with pytest.raises(ValueError, match="at least one token"):
        session.extend([], 1)
    with pytest.raises(ValueError, match=r"n_logits must be in 1..3"):
        session.extend([1, 2, 3], 4)
    with pytest.raises(IndexError, match="token_embd.weight"):
        session.extend([256], 1)
    assert session.length == 0
    with pytest.raises(ValueError, match="max_length must be a positive integer"):
        LeanLM(models["draft"], max_length=0)


def test_a_session_speaks_what_the_loops_and_step_records_need(models, files):
    session = LeanLM(files["draft"], eos_token_ids=[1, 7])  # a path is read; eos ids may be overridden
    assert (session.vocab_size, session.eos_token_ids, session.length) == (256, frozenset({1, 7}), 0)
    assert LeanLM(models["draft"]).eos_token_ids == frozenset({1})
    assert session.kernel_for(1).startswith("gguf-") and session.kernel_for(9) == session.kernel_for(1)
    assert session.keys.shape == (2, 2, 4096, 64) and session.keys.dtype == torch.float32


# --- batch invariance ----------------------------------------------------------------------------------------------
@needs_invariant
@pytest.mark.parametrize("name", ["target", "draft"])
def test_a_position_gets_the_same_logits_in_a_step_and_in_a_verify_pass_of_any_size(models, name, threads):
    session = LeanLM(models[name])
    single, passes = step_and_pass_logits(session, TOKENS, prompt_length=20, steps=16)
    differing, rows = count_differing_rows(single, passes)
    assert (differing, rows) == (0, rows) and rows > 400
    other = at_threads(3 - threads, lambda: step_and_pass_logits(session, TOKENS, prompt_length=20, steps=4)[0])
    assert torch.equal(other, single[:4])


@needs_invariant
def test_every_product_kernel_gives_a_session_the_same_logits(models, kernel):
    """Steps and verify passes of the whole forward (fused layers, head) on this kernel equal the AVX2 kernel's bit
    for bit: the kernel a machine picks changes speed, never a token."""
    session = LeanLM(models["target"])
    single, passes = step_and_pass_logits(session, TOKENS, prompt_length=20, steps=6)
    with quant.use_kernel("avx2"):
        single_avx2, passes_avx2 = step_and_pass_logits(session, TOKENS, prompt_length=20, steps=6)
    assert torch.equal(single, single_avx2)
    assert all(torch.equal(a[2], b[2]) for a, b in zip(passes, passes_avx2))
    grouped = session.model.layers[0].q.layout == "r16"  # Q4_K in groups of 16 rows where the kernel is AVX-512's
    assert session.kernel_for(1) == f"gguf-{kernel}" + ("-r16" if grouped else "")


@needs_invariant
def test_the_invariance_check_catches_torchs_attention_in_a_verify_pass(models, monkeypatch):
    """The check above has power: torch's attention for the decoding-sized passes (its blocking follows the row
    count) makes rows differ."""
    monkeypatch.setattr(lean, "_invariant_attention", lean._sdpa_attention)
    session = LeanLM(models["target"], fused=False)  # the Python forward, whose attention is swapped
    single, passes = step_and_pass_logits(session, TOKENS, prompt_length=20, steps=8)
    assert count_differing_rows(single, passes)[0] > 0


# --- decoding ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def prompts():
    generator = torch.Generator().manual_seed(11)
    repeating = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]])  # prompt lookup finds matches
    return [torch.randint(2, 256, (1, n), generator=generator) for n in (6, 19, 40)] + [repeating]


class WrongEvery:
    """A session whose top token is wrong after every `period`-th position: a draft whose blocks are cut in the
    middle, whatever the model."""

    def __init__(self, session, period: int):
        self.session, self.period = session, period

    def __getattr__(self, name):
        return getattr(self.session, name)

    def extend(self, tokens, n_logits):
        logits = self.session.extend(tokens, n_logits).clone()
        for row, position in enumerate(range(self.session.length - n_logits, self.session.length)):
            if position % self.period == 0:
                logits[row, logits[row].argmax()] = -1e9
        return logits


@needs_product
def test_greedy_speculative_decoding_with_lean_sessions_equals_greedy_decoding(models, prompts):
    """Targets and drafts both lean: an unrelated draft (mostly rejected), the target's own first layer (mostly
    accepted), the target itself (every block accepted: the bonus token and the catch-up), the target wrong every
    fourth position (blocks cut in the middle), and the hybrid."""
    deep = models["deep"]
    target = LeanLM(deep)
    drafts = {"other": lambda: LeanLM(models["draft"]), "cut": lambda: LeanLM(deep, layers=1),
              "same": lambda: ModelDraft(LeanLM(deep)), "wrong": lambda: ModelDraft(WrongEvery(LeanLM(deep), 4)),
              "hybrid": lambda: HybridDraft(PromptLookupDraft(256), ModelDraft(LeanLM(deep, layers=1)))}
    accepted, blocks = {}, []
    for prompt in prompts:
        expected = generate_baseline(target, prompt, max_new_tokens=24)
        assert expected.steps[0].kernel.startswith("gguf-")
        for name, make in drafts.items():
            for k in (1, 3, 5):
                result = generate_speculative(target, make(), prompt, k=k, max_new_tokens=24)
                assert result.tokens == expected.tokens, (name, k, prompt.shape)
                assert all(step.draft_kernel.startswith("gguf-") for step in result.steps[1:])
                accepted.setdefault(name, []).append(result.acceptance)
                blocks += [(step.accepted, step.drafted) for step in result.steps if step.drafted]
    mean = {name: round(float(np.nanmean(values)), 3) for name, values in accepted.items()}
    # every path of the loop ran: blocks kept whole (bonus token, catch-up), rejected at once, and cut in the middle
    # (the target crops inside the block, the draft rolls back to part of it)
    assert mean["same"] == 1.0 and mean["other"] < 0.1 and 0.3 < mean["wrong"] < 1.0, mean
    assert any(0 < kept < drafted for kept, drafted in blocks), f"no block was cut in the middle: {mean}"


# --- the real files --------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"])
def test_the_real_files_compute_their_fp32_models(name, monkeypatch):
    """The lean forward on a study GGUF file against the fp32 model the study dequantised from it, over one chat
    prompt's 43 positions. Measured: with exact products the same bits (max |diff| 0); with the native product's
    8-bit activations the 0.5B's logits move by 1.3% (median; max |diff| 0.67) with top-1 agreement 43/43, the
    1.5B's by 2.1% (max |diff| 15 at the first position, <|im_start|>, whose hidden state reaches 511; 0.32 at the
    last) with 41/43."""
    gguf_path, model_dir = REAL / "gguf" / f"{name}.gguf", REAL / "models" / name
    if not (gguf_path.is_file() and model_dir.is_dir()):
        pytest.skip(f"{gguf_path} or {model_dir} not here")
    from specdec.lm import eos_ids_of
    from specdec.fp32.loading import load_model

    hf, tokenizer = load_model(model_dir)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Write a Python function that merges two "
                                          "sorted lists into one sorted list."}], add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    with torch.inference_mode():
        expected = hf(torch.tensor([ids])).logits[0].float()
    eos = eos_ids_of(hf)
    del hf  # one fp32 copy of the weights at a time
    session = LeanLM(gguf_path)
    assert session.eos_token_ids == eos
    if quant.available():
        got = torch.cat([session.extend(ids[:-8], len(ids) - 8)] + [session.extend([t], 1) for t in ids[-8:]])
        worst, error = (got - expected).abs().max(dim=-1).values, relative_error(got, expected)
        top1 = (got.argmax(-1) == expected.argmax(-1)).float().mean().item()
        message = (f"{name}: {len(ids)} positions, max |diff| {worst.max():.3f} (median {worst.median():.3f}, last "
                   f"{worst[-1]:.3f}), relative error median {error.median():.4f} max {error.max():.4f}, top-1 "
                   f"agreement {top1:.3f}")
        print(message)
        assert error.median() < 0.05 and top1 >= 0.9 and got[-1].argmax() == expected[-1].argmax(), message
    exact_products(monkeypatch)
    session.reset()
    got = session.extend(ids, len(ids))
    assert (got - expected).abs().max() < 1e-4 * expected.abs().max(), (got - expected).abs().max()


# --- a head limited to the first token ids (a model draft's `vocab`) -------------------------------------------------
@needs_product
@pytest.mark.parametrize("layout", ["rows", "auto"])
def test_a_head_limited_to_the_first_ids_gives_their_logits_bit_for_bit_and_minus_infinity_elsewhere(
        files, layout, monkeypatch):
    """limit_head_vocab(V): the first V logits are the whole head's, bit for bit (the same rows of the same product;
    V need not be a whole group of 16 in the grouped layout), every other one is -inf; a step reads fewer bytes."""
    monkeypatch.setenv(quant.LAYOUT_ENV, layout)
    model = read_gguf(files["draft"])
    whole = LeanLM(model)
    expected = whole.extend(TOKENS[:9], 3)
    for vocab in (2, 100, 256):
        limited = LeanLM(model)
        limited.limit_head_vocab(vocab)
        logits = limited.extend(TOKENS[:9], 3)
        assert logits.shape == expected.shape
        assert torch.equal(logits[:, :vocab], expected[:, :vocab]), vocab
        assert bool((logits[:, vocab:] == float("-inf")).all()), vocab
        assert limited.step_bytes() < whole.step_bytes() or vocab == 256
    for bad in (1, 257, True, 2.5):
        with pytest.raises(ValueError, match="a head vocabulary must be an integer in 2..256"):
            LeanLM(model).limit_head_vocab(bad)


@needs_product
@pytest.mark.parametrize("layout", ["rows", "auto"])
def test_a_requantised_head_gives_the_requantised_rows_logits_with_or_without_a_vocabulary(files, layout, monkeypatch):
    """requantize_head(T): the logits are the product of the head's rows in T (QuantMatrix.requantized) with the
    same normed hidden states, bit for bit; limiting the vocabulary before or after gives their first ids; a step
    reads fewer bytes (Q8_0 -> Q5_0) and the logits are a rounding away from the file's."""
    from specdec.native import rowops

    monkeypatch.setenv(quant.LAYOUT_ENV, layout)
    model = read_gguf(files["draft"])
    assert model.output.qtype == "Q8_0"
    whole = LeanLM(model)
    expected = whole.extend(TOKENS[:9], 3)
    requantised = LeanLM(model)
    requantised.requantize_head("Q5_0")
    logits = requantised.extend(TOKENS[:9], 3)
    normed = rowops.rms_norm(whole.last_hidden[-3:], model.output_norm, model.config.rms_eps)
    assert torch.equal(logits, model.output.requantized("Q5_0").matmul(normed))
    assert not torch.equal(logits, expected) and requantised.step_bytes() < whole.step_bytes()
    limited_file_head = LeanLM(model)
    limited_file_head.limit_head_vocab(100)
    for type_first in (False, True):
        session = LeanLM(model)
        steps = [lambda: session.limit_head_vocab(100), lambda: session.requantize_head("Q5_0")]
        for step in reversed(steps) if type_first else steps:
            step()
        out = session.extend(TOKENS[:9], 3)
        assert torch.equal(out[:, :100], logits[:, :100]) and bool((out[:, 100:] == float("-inf")).all())
        assert session.step_bytes() < limited_file_head.step_bytes()


@needs_product
@pytest.mark.parametrize("head", [{}, {"head_type": "q5_0"}], ids=["file-head", "q5_0-head"])
def test_a_draft_over_the_first_ids_keeps_greedy_identity_and_proposes_only_those(models, prompts, head):
    """The registry's model kind with `vocab` (and its head requantised): greedy speculative decoding equals greedy
    decoding, and every drafted token lies among the first ids (where the target's token does not, the block is cut
    and the target's kept)."""
    from specdec.drafts import DraftResources, get_kind

    deep = models["deep"]
    target = LeanLM(deep)
    kind = get_kind("model")
    drafted, rejected = [], 0
    for prompt in prompts:
        expected = generate_baseline(target, prompt, max_new_tokens=24)
        for k in (1, 3):
            draft = kind.build({"kind": "model", "model": "deep", "vocab": 40, **head},
                               DraftResources(target=target, vocab_size=256, eos_token_ids=frozenset(),
                                              draft_model=lambda: LeanLM(deep, layers=1)))
            original = draft.propose

            def propose(*args, original=original):
                proposal = original(*args)
                drafted.extend(proposal.tokens)
                return proposal

            draft.propose = propose
            result = generate_speculative(target, draft, prompt, k=k, max_new_tokens=24)
            assert result.tokens == expected.tokens, (k, prompt.shape)
            rejected += sum(step.accepted < step.drafted for step in result.steps if step.drafted)
    assert drafted and max(drafted) < 40 and rejected, (max(drafted), rejected)


@pytest.mark.parametrize("field, words", [({"vocab": 8}, "`vocab` limits a GGUF file's LM head"),
                                           ({"head_type": "q5_0"}, "`head_type` requantises a GGUF file's LM head")])
def test_a_head_of_its_own_is_refused_for_a_model_that_is_not_a_gguf_session(field, words):
    from specdec.drafts import DraftResources, get_kind
    from specdec.errors import DraftSpecError
    from specdec.testing import tiny_qwen2

    resources = DraftResources(target=None, vocab_size=64, eos_token_ids=frozenset(),
                               draft_model=lambda: tiny_qwen2(vocab_size=64, hidden_size=16))
    with pytest.raises(DraftSpecError, match=words):
        get_kind("model").build({"kind": "model", "model": "x", **field}, resources)
