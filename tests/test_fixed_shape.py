"""The fixed-shape session (specdec/fixed_shape.py): every pass R rows over a static KV cache with a mask.

What these tests prove, with torch's own kernels (no native kernels), in fp32 and bf16, on 1 and 2 threads, and on
cuda where one is present (CUDA graphs on there):
- identity by construction: a position's logits (and its features) are the same bits in a one-token step and in a
  verify pass of every m in 1..R at several offsets, after a prompt longer than R (fed in chunks);
- the check has power: the same passes unpadded (each pass only its own rows), or in a CachedLM, differ on this CPU;
- the session computes the model: its logits and features agree with CachedLM's to float noise;
- crop / reset / extend keep the cache exact (bit for bit against a fresh session), and bad input is a clear error;
- greedy identity of every registered draft kind, target (and every draft model) in fixed-shape sessions, k 1, 2, 4;
- the runtime's session fields and the factory that builds the session they name.
"""

from __future__ import annotations

import pytest
import torch
from toy_draft import RepeatLastDraft  # noqa: F401  (registers the toy kind: the kind list does not depend on order)
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specdec.decode import generate_baseline, generate_speculative
from specdec.drafts import DraftResources, get_kind, kind_names
from specdec.fixed_shape import FixedShapeLM, session_for, target_layer_sessions
from specdec.lm import CachedLM
from specdec.runtime import Runtime
from specdec.testing import (at_threads, count_differing_rows, example_spec, perturbed_copy, step_and_pass_logits,
                             tiny_qwen2)

CUDA = torch.cuda.is_available()
DEVICES = [pytest.param("cpu"),
           pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no cuda device here"))]
DTYPES = [pytest.param(torch.float32, id="f32"), pytest.param(torch.bfloat16, id="bf16")]
ROWS = 16
PROMPT, STEPS = 20, ROWS  # a prompt longer than R (two chunks), then passes of every m in 1..R
TOKENS = torch.randint(0, 128, (64,), generator=torch.Generator().manual_seed(5)).tolist()


def model_on(device: str, dtype: torch.dtype = torch.float32, **kwargs):
    """A tiny random Qwen2 (128 tokens, 64 wide, the native kernels' tests' model) in dtype on device."""
    spec = {"vocab_size": 128, "hidden_size": 64, "seed": 3, **kwargs}
    return tiny_qwen2(**spec, dtype=torch.float32).to(dtype).to(device)


class UnpaddedLM(FixedShapeLM):
    """The same session with its padding taken away: each pass runs only its own rows (the static cache and mask
    stay). Not batch-invariant: what the identity test must catch."""

    def _pass_rows(self, real_rows: int) -> int:
        return real_rows


# --- identity by construction ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_step_and_every_verify_pass_give_the_same_bits(device, dtype, threads):
    model = model_on(device, dtype)
    session = FixedShapeLM(model, max_length=64, rows=ROWS)
    single, passes = step_and_pass_logits(session, TOKENS, prompt_length=PROMPT, steps=STEPS)
    differing, compared = count_differing_rows(single, passes)
    assert {m for _, m, _ in passes} == set(range(1, ROWS + 1)) and compared > 400
    assert differing == 0, f"{differing} of {compared} rows differ from the one-token step's"
    assert session.describe()["graphs"] == ("cuda_graph" if device == "cuda" else "off")
    if device == "cpu":  # the same bits on the other thread count: not promised by construction, true here
        other = at_threads(3 - threads, lambda: step_and_pass_logits(FixedShapeLM(model, 64, ROWS), TOKENS,
                                                                     PROMPT, 4)[0])
        assert torch.equal(other, single[:4])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_features_are_the_same_bits_in_a_step_and_in_a_verify_pass(device, dtype):
    """What a feature head reads (final hidden state and a kept layer's output) is batch-invariant too."""
    def features(chunks):
        session = FixedShapeLM(model_on(device, dtype), max_length=64, rows=ROWS)
        session.keep_hidden_states([1])
        for start, end in chunks:
            session.extend(TOKENS[start:end], 1)
        return session.hidden_states(PROMPT, PROMPT + 8)

    steps = features([(0, PROMPT)] + [(PROMPT + i, PROMPT + i + 1) for i in range(8)])
    verify = features([(0, PROMPT), (PROMPT, PROMPT + 8)])
    assert steps.shape == (8, 2 * 64) and torch.equal(steps, verify)


def test_the_identity_check_has_power():
    """On this CPU the same check catches the passes that are not fixed-shape: unpadded passes in fp32 (MKL's
    product of one row is not its product of m rows), and a CachedLM (keys of the pass's own length, torch's causal
    attention) in fp32 and bf16. Unpadded bf16 passes happen to be identical here: the static cache's fixed key
    length, not the padding, is what that dtype needed on this machine. How many of the 494 rows a CachedLM's bf16
    passes change depends on the CPU's bf16 kernels: over 100 with AVX512-BF16, 37 on the AMD EPYC Zen 3 (AVX2 only);
    20 is far from none."""
    model = model_on("cpu", torch.float32)
    single, passes = step_and_pass_logits(UnpaddedLM(model, 64, ROWS), TOKENS, PROMPT, STEPS)
    assert count_differing_rows(single, passes)[0] > 100
    for dtype, least in ((torch.float32, 100), (torch.bfloat16, 20)):
        single, passes = step_and_pass_logits(CachedLM(model_on("cpu", dtype)), TOKENS, PROMPT, STEPS)
        assert count_differing_rows(single, passes)[0] > least, dtype


# --- the session computes the model ---------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-10), (torch.float32, 1e-4), (torch.bfloat16, 0.25)],
                         ids=["f64", "f32", "bf16"])
def test_logits_and_features_agree_with_a_cached_session(device, dtype, tolerance):
    if device == "cuda" and dtype == torch.float64:
        pytest.skip("fp64 on cuda says nothing about the GPU path")
    model = model_on(device, dtype)
    fixed, cached = FixedShapeLM(model, max_length=64, rows=ROWS), CachedLM(model)
    for session in (fixed, cached):
        session.keep_hidden_states([0])
    # a prompt of three chunks, a verify pass of 5, a rejection (crop), a step
    feeds = [(TOKENS[:40], 40), (TOKENS[40:45], 5), (TOKENS[45:46], 1)]
    for tokens, n_logits in feeds[:2]:
        got, expected = fixed.extend(tokens, n_logits), cached.extend(tokens, n_logits)
        assert got.dtype == torch.float32 and got.device.type == "cpu" and got.shape == expected.shape
        assert (got - expected).abs().max() < tolerance
    for session in (fixed, cached):
        session.crop(42)
    assert (fixed.extend(*feeds[2]) - cached.extend(*feeds[2])).abs().max() < tolerance
    features, reference = fixed.hidden_states(0, 43), cached.hidden_states(0, 43)
    assert features.shape == reference.shape == (43, 2 * 64)
    assert (features.float() - reference.float()).abs().max() < tolerance


# --- crop / reset / extend -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_crop_reset_and_extend_keep_the_cache_exact(device):
    model = model_on(device, torch.float32)
    session = FixedShapeLM(model, max_length=48, rows=ROWS)
    prompt, rejected, accepted = TOKENS[:20], TOKENS[20:26], TOKENS[30:33]
    session.extend(prompt, 1)
    session.extend(rejected, len(rejected))
    session.crop(21)  # keeps the first drafted token
    assert session.length == 21
    after_rollback = session.extend(accepted, 3)
    fresh = FixedShapeLM(model, max_length=48, rows=ROWS)
    fresh.extend(prompt + rejected[:1], 1)
    assert torch.equal(after_rollback, fresh.extend(accepted, 3))  # stale slots past 21 change nothing
    # a reset (or a crop to 0) starts again: the same bits as the first sequence
    first = FixedShapeLM(model, max_length=48, rows=ROWS).extend(prompt, 20)
    session.reset()
    assert session.length == 0 and torch.equal(session.extend(prompt, 20), first)
    session.crop(0)
    assert torch.equal(session.extend(prompt, 20), first)
    # logits of positions across chunks (n_logits > R), fed at once, are each one's step logits
    stepped = FixedShapeLM(model, max_length=48, rows=ROWS)
    steps = torch.cat([stepped.extend([t], 1) for t in prompt])
    assert torch.equal(first, steps)
    chunked = FixedShapeLM(model, max_length=48, rows=ROWS)
    chunked.extend(TOKENS[:40], 1)
    assert chunked.passes == 3  # 16 + 16 + 8 rows: each chunk a fixed-shape pass
    # the whole static cache can be filled, not one token more
    session.reset()
    session.extend(TOKENS[:48], 1)
    assert session.length == 48
    with pytest.raises(ValueError, match="exceeds the static cache's max_length 48"):
        session.extend([1], 1)


def test_features_follow_crop_and_reset():
    session = FixedShapeLM(model_on("cpu"), max_length=32, rows=4)
    session.keep_hidden_states()
    session.extend(TOKENS[:10], 1)
    held = session.hidden_states(0, 10).clone()
    session.crop(6)
    with pytest.raises(IndexError, match="positions 0..9 asked"):
        session.hidden_states(0, 10)
    session.extend(TOKENS[6:10], 1)
    assert torch.equal(session.hidden_states(0, 10), held)
    session.reset()
    session.extend(TOKENS[:3], 1)
    assert torch.equal(session.hidden_states(0, 3), held[:3])


# --- bad input -------------------------------------------------------------------------------------------------------
def test_bad_input_is_a_clear_error():
    model = model_on("cpu")
    for rows in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="rows must be a positive integer"):
            FixedShapeLM(model, 32, rows)
    with pytest.raises(ValueError, match="max_length must be a positive integer"):
        FixedShapeLM(model, 0)
    with pytest.raises(ValueError, match="graphs must be one of"):
        FixedShapeLM(model, 32, graphs="always")
    with pytest.raises(ValueError, match="captures CUDA graphs; this model is on cpu"):
        FixedShapeLM(model, 32, graphs="cuda_graph")
    session = FixedShapeLM(model, 8, rows=4)
    with pytest.raises(ValueError, match="at least one token"):
        session.extend([], 1)
    for n_logits in (0, 3, 1.0):
        with pytest.raises(ValueError, match=r"n_logits must be an integer in 1..2"):
            session.extend([1, 2], n_logits)
    with pytest.raises(ValueError, match="feeding 9 tokens after 0 exceeds the static cache's max_length 8"):
        session.extend(TOKENS[:9], 1)
    with pytest.raises(ValueError, match=r"token ids must lie in 0..127, got 5..128"):
        session.extend([5, 128], 1)
    session.extend([1, 2, 3], 1)
    with pytest.raises(ValueError, match="cannot crop to 4: the cache holds only 3 tokens"):
        session.crop(4)
    for length in (-1, 1.5):
        with pytest.raises(ValueError, match="crop needs a length >= 0"):
            session.crop(length)
    assert session.length == 3  # nothing above changed the session


def test_models_it_cannot_run_are_refused_by_name():
    with pytest.raises(TypeError, match="not a decoder-only causal LM"):
        FixedShapeLM(torch.nn.Linear(2, 2), 8)
    invariant = model_on("cpu")
    invariant.config._attn_implementation = "specdec_invariant"
    with pytest.raises(TypeError, match="applies its mask .* this model runs 'specdec_invariant'"):
        FixedShapeLM(invariant, 8)
    mistral = MistralForCausalLM(MistralConfig(vocab_size=16, hidden_size=16, intermediate_size=32,
                                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(TypeError, match="runs model types .* this model is 'mistral'"):
        FixedShapeLM(mistral, 8)
    sliding = Qwen2ForCausalLM(Qwen2Config(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                           num_attention_heads=2, num_key_value_heads=1, use_sliding_window=True,
                                           sliding_window=4, max_window_layers=0))
    with pytest.raises(TypeError, match="full causal attention only.*sliding_attention"):
        FixedShapeLM(sliding, 8)
    dynamic = Qwen2ForCausalLM(Qwen2Config(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, num_key_value_heads=1,
                                           rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                            "rope_theta": 1e4}))
    with pytest.raises(TypeError, match="rope type is 'dynamic'"):
        FixedShapeLM(dynamic, 8)


# --- greedy identity of every draft kind through fixed-shape sessions -----------------------------------------------
VOCAB, MAX_NEW, LENGTH = 64, 12, 40
KS = (1, 2, 4)


@pytest.fixture(scope="module")
def greedy_models():
    """fp32 with torch's kernels (no order-fixed ones): an identity here is the session's, not float64's."""
    target = tiny_qwen2(vocab_size=VOCAB, num_layers=3, seed=0, dtype=torch.float32)
    return target, perturbed_copy(target, noise=0.05)


def fixed(model, rows: int = ROWS) -> FixedShapeLM:
    return FixedShapeLM(model, max_length=LENGTH, rows=rows)


def build_draft(kind_name: str, target_model, target_session, draft_model, rows: int):
    """The kind's proposer as a decode job builds it with runtime session 'fixed': its model (and an early exit's
    cut of the target) in fixed-shape sessions, a feature head reading the target session's features."""
    kind = get_kind(kind_name)
    spec = example_spec(kind)
    model = kind.untrained(spec, target_model) if kind.untrained is not None else fixed(draft_model, rows)
    runtime = Runtime(linear_kernel="default", session="fixed", session_rows=rows)
    resources = DraftResources(target=target_session, vocab_size=VOCAB, eos_token_ids=frozenset(),
                               draft_model=(lambda: model) if kind.model else None,
                               target_layers=target_layer_sessions(target_model, runtime, max_length=LENGTH))
    return kind.build(spec, resources)


def model_sessions(proposer) -> list:
    """The sessions a proposer runs a draft model in (its own, or its model draft's: a hybrid's)."""
    owners = [proposer, getattr(proposer, "model", None)]
    return [owner.session for owner in owners if hasattr(owner, "session")]


def assert_greedy_identity(target_model, draft_model, kind_name: str, rows: int = ROWS, ks=KS) -> None:
    target = fixed(target_model, rows)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, VOCAB, (int(n),), generator=g).tolist() for n in (3, 18)]
    prompts += [p[:3] * 3 for p in prompts[:1]]  # repeats: lookup-style kinds find matches
    drafted = 0
    for prompt in prompts:
        ids = torch.tensor([prompt])
        baseline = generate_baseline(target, ids, MAX_NEW).tokens
        for k in ks:
            draft = build_draft(kind_name, target_model, target, draft_model, rows)
            assert all(isinstance(s, FixedShapeLM) for s in model_sessions(draft)), kind_name
            result = generate_speculative(target, draft, ids, k, MAX_NEW)
            assert result.tokens == baseline, (kind_name, k, prompt)
            drafted += result.drafted
    if kind_name == "feature_head":  # it drafted from the loop's target session's own features
        assert target.hidden_states(0, target.length).shape[0] == target.length
    assert drafted > 0


@pytest.mark.parametrize("kind_name", kind_names())
def test_greedy_identity_for_every_kind_through_fixed_shape_sessions(greedy_models, kind_name):
    assert_greedy_identity(*greedy_models, kind_name)


@pytest.mark.parametrize("kind_name", ["model", "feature_head"])
def test_greedy_identity_when_a_verify_pass_spans_two_chunks(greedy_models, kind_name):
    """rows 4 and k 4: a verify pass over 5 positions runs as two fixed-shape passes (4 + 1 rows)."""
    assert_greedy_identity(*greedy_models, kind_name, rows=4, ks=(4,))


# --- the runtime's choice and the factory ---------------------------------------------------------------------------
def test_the_runtime_names_the_session_and_the_factory_builds_it():
    model = model_on("cpu")
    assert isinstance(session_for(model, Runtime()), CachedLM)
    runtime = Runtime(linear_kernel="default", session="fixed", session_rows=8)
    session = session_for(model, runtime, max_length=24, eos_token_ids=[3])
    assert isinstance(session, FixedShapeLM) and session.eos_token_ids == {3}
    assert session.describe() == {"kind": "fixed", "rows": 8, "max_length": 24, "graphs": "off", "device": "cpu",
                                  "dtype": "float32"}
    with pytest.raises(ValueError, match="session_for needs its max_length"):
        session_for(model, runtime)
    early = target_layer_sessions(model, runtime, max_length=24)(1)
    assert isinstance(early, FixedShapeLM) and early.rows == 8 and len(early.model.model.layers) == 1


def test_bad_runtime_sessions_are_clear_errors():
    with pytest.raises(ValueError, match=r"runtime session must be one of \('cached', 'fixed'\), got 'static'"):
        Runtime(session="static")
    for rows in (0, True, "16"):
        with pytest.raises(ValueError, match="runtime session_rows must be a positive integer"):
            Runtime(session_rows=rows)
    with pytest.raises(ValueError, match="session 'fixed' runs Hugging Face models"):
        Runtime(weights="gguf", session="fixed")
    with pytest.raises(ValueError, match="linear_kernel 'invariant' swaps in the native attention"):
        Runtime(session="fixed")
    assert Runtime(device="cuda", session="fixed").linear_kernel == "invariant"  # not applied off the CPU


# --- graphs ---------------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not CUDA, reason="no cuda device here")
def test_a_cuda_graph_is_captured_once_per_kind_of_output_and_replayed():
    session = FixedShapeLM(model_on("cuda"), max_length=64, rows=ROWS)
    step_and_pass_logits(session, TOKENS, PROMPT, 4)
    assert session.captures == 1 and session.passes > 20
    session.keep_hidden_states([0])
    session.reset()
    session.extend(TOKENS[:PROMPT], 1)
    assert session.captures == 2 and session.hidden_states(0, PROMPT).shape == (PROMPT, 2 * 64)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_the_compiled_pass_keeps_the_identity_and_computes_the_model(device):
    """graphs 'compile' (torch.compile, mode reduce-overhead; ~30 s of compilation on the CPU): other kernels than
    eager torch's, the same fixed shape, so the same identity."""
    model = model_on(device, torch.float32)
    session = FixedShapeLM(model, max_length=64, rows=ROWS, graphs="compile")
    single, passes = step_and_pass_logits(session, TOKENS, PROMPT, STEPS)
    assert count_differing_rows(single, passes)[0] == 0 and session.captures == 1
    eager, _ = step_and_pass_logits(FixedShapeLM(model, max_length=64, rows=ROWS), TOKENS, PROMPT, 2)
    assert (single[:2] - eager).abs().max() < 1e-4
