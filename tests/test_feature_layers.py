"""A feature head that fuses some of the target's layers (EAGLE-3's low, middle and high features) beside its final
hidden state: the sessions keep those layers' outputs (both engines, bit for bit what the layers compute, no change
to the target's own results), the head folds them in (zero-initialised when widened from a trained head: it then
drafts exactly as before), training and drafting see the same inputs, the data carry the layers they hold, and the
exact rule stays exact."""

from __future__ import annotations

import json

import pandas as pd

import pytest
import torch

from specdec.gguf import fused_layers
from specdec.decode import generate_baseline, generate_speculative
from specdec.drafts.feature_head import FeatureHead, FeatureHeadDraft, HeadCache, TargetParts, untrained_head
from specdec.errors import DraftSpecError
from specdec.gguf.lean import LeanLM, _runs_between
from specdec.lm import CachedLM, PrefixMemoLM
from specdec.sampling import SamplingConfig
from specdec.study.verify.distribution import exact_first_tokens
from specdec.study.training.feature_head import (
    LAYERS_FILE,
    FeatureHeadSettings,
    greedy_blocks,
    head_data,
    head_losses,
    load_head_data,
    train_feature_head,
    unrolled_predictions,
    with_fused_layers,
)
from specdec.study.stats import chi_square_gof
from specdec.testing import tiny_gguf, tiny_qwen2

# a block of rejected drafts, then crops and steps of several sizes: every path a decoding loop takes
STEPS = [("extend", 5), ("extend", 3), ("crop", 5), ("extend", 4), ("extend", 1), ("extend", 1)]


def run_steps(session, ids, after=None):
    """Feed ids through STEPS (a rejected block [7, 8, 9] after the first five); `after(session)` after each
    extend. Returns the positions fed in the end (len(ids[:11]))."""
    fed = 0
    for what, n in STEPS:
        if what == "crop":
            session.crop(n)
            fed = n
        else:
            tokens = [7, 8, 9] if (what, n) == ("extend", 3) else ids[fed:fed + n]
            session.extend(tokens, 1)
            fed += len(tokens)
            if after is not None:
                after(session)
    return fed


@pytest.fixture(scope="module")
def target():
    return tiny_qwen2(vocab_size=64, num_layers=3, seed=0)


def hf_layers(model, ids):
    """(final hidden states, [output of layer 0, of layer 1, ..., of the last but one]) of a whole sequence in one
    forward (Hugging Face's last hidden_states entry is after the final norm, not the last layer's output)."""
    with torch.no_grad():
        out = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.last_hidden_state[0], [h[0] for h in out.hidden_states[1:-1]]


@pytest.mark.parametrize("session_type", [CachedLM, PrefixMemoLM])
def test_a_session_keeps_the_chosen_layers_outputs_beside_its_features(target, session_type):
    ids = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    session = session_type(target)
    session.keep_hidden_states([0, 1])
    fed = run_steps(session, ids)
    final, layers = hf_layers(target, ids[:fed])
    rows = session.hidden_states(0, fed)
    h = final.shape[1]
    assert rows.shape == (fed, 3 * h)
    for part, expected in zip(rows.split(h, dim=1), [final, layers[0], layers[1]]):
        torch.testing.assert_close(part, expected, rtol=0, atol=1e-5)
    assert session.hidden_states(3, 3).shape == (0, 3 * h)
    with pytest.raises(ValueError, match=r"already keeps the outputs of layers \[0, 1\].*asked for \[2\]"):
        session.keep_hidden_states([2])
    session.keep_hidden_states([0, 1])  # the same again: nothing changes


@pytest.mark.parametrize("layers", [[3], [1, 1], [2, 0], [-1], [True]])
def test_layers_a_session_cannot_keep_are_refused_by_name(target, layers):
    with pytest.raises(ValueError, match=r"increasing distinct decoder layers in 0\.\.2"):
        CachedLM(target).keep_hidden_states(layers)


@pytest.fixture(scope="module")
def gguf_target(tmp_path_factory):
    return tiny_gguf(tmp_path_factory.mktemp("layers") / "target.gguf", layers=3, vocab_size=64)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_lean_engine_keeps_each_layers_output_bit_for_bit_and_its_results_do_not_change(gguf_target, fused,
                                                                                          threads):
    """A kept layer's rows are those a session of only the layers up to it computes (its last_hidden), bit for bit;
    the final hidden states and the logits are those of a session keeping nothing. Steps of 1 to 4 rows (the native
    path, split into runs between kept layers) and a prompt pass past the invariant rows (the torch path)."""
    if fused and not fused_layers.available():
        pytest.skip("the fused layers are not built")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ids = torch.randint(2, 64, (48,), generator=torch.Generator().manual_seed(2)).tolist()
        keeping = LeanLM(gguf_target, max_length=64, fused=fused)
        keeping.keep_hidden_states([0, 1])
        plain = LeanLM(gguf_target, max_length=64, fused=fused)
        plain.keep_hidden_states()
        cut = [LeanLM(gguf_target, max_length=64, layers=n, fused=fused) for n in (1, 2)]
        for tokens in ([ids[:40]], [ids[40:41], ids[41:45], ids[45:46]]):
            for chunk in tokens:
                logits = keeping.extend(chunk, len(chunk))
                assert torch.equal(logits, plain.extend(chunk, len(chunk)))
                rows = keeping.hidden_states(keeping.length - len(chunk), keeping.length)
                h = rows.shape[1] // 3
                assert torch.equal(rows[:, :h], plain.hidden_states(plain.length - len(chunk), plain.length))
                for i, session in enumerate(cut):
                    session.extend(chunk, 1)
                    assert torch.equal(rows[:, (i + 1) * h:(i + 2) * h], session.last_hidden), (i, len(chunk))
    finally:
        torch.set_num_threads(previous)


def test_runs_between_kept_layers_cover_every_layer_once():
    assert _runs_between((), 4) == [range(0, 4)]
    assert _runs_between((0, 2), 4) == [range(0, 1), range(1, 3), range(3, 4)]
    assert _runs_between((1, 3), 4) == [range(0, 2), range(2, 4)]


@pytest.mark.skipif(not fused_layers.available(), reason="the fused layers are not built")
@pytest.mark.parametrize("layers", [range(0, 0), range(2, 4), range(0, 3, 2), (0, 1), range(-1, 1)])
def test_the_fused_call_refuses_a_run_of_layers_outside_its_plan(gguf_target, layers):
    session = LeanLM(gguf_target, max_length=8)
    with pytest.raises(ValueError, match=r"layers must be a non-empty range\(a, b\) within range\(0, 3\)"):
        session._fused.forward(torch.zeros(1, session.config.hidden), 0, None, layers)


# --- the head --------------------------------------------------------------------------------------------------------
LAYERS = [0, 1]


def fused_head(target, seed=1, scale=0.5, vocab=None):
    """An untrained head that fuses LAYERS, its fusion random (zero would hide whether the layers are read)."""
    head = untrained_head(target, vocab, seed=seed, fused_layers=LAYERS).float()
    with torch.no_grad():
        head.fuse.weight.normal_(0, scale / head.fuse.weight.shape[1] ** 0.5,
                                 generator=torch.Generator().manual_seed(seed))
    return head


def proposal(head, target, context, sampling, seed=0):
    draft = FeatureHeadDraft(head, target)
    draft.prefill(context)
    return draft.propose(context, 3, sampling, torch.Generator().manual_seed(seed))


def test_a_head_widened_with_layers_drafts_as_before_until_its_fusion_learns(target):
    head = untrained_head(target, seed=2).float()
    wide = with_fused_layers(head, LAYERS)
    assert wide.config.fused_layers == (0, 1) and torch.equal(wide.fuse.weight, torch.zeros_like(wide.fuse.weight))
    context, sampling = [5, 9, 2, 7, 5, 9, 3], SamplingConfig(0.9)
    before, after = proposal(head, target, context, sampling), proposal(wide, target, context, sampling)
    assert before.tokens == after.tokens and torch.equal(before.q, after.q)
    with torch.no_grad():
        wide.fuse.weight.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(proposal(wide, target, context, sampling).q, before.q)  # the layers are read
    assert with_fused_layers(wide, LAYERS) is wide
    with pytest.raises(DraftSpecError, match=r"fuses target layers \[0, 1\]; this training fuses \[2\]"):
        with_fused_layers(wide, [2])


def test_a_fused_head_saves_and_loads_bit_for_bit(target, tmp_path):
    head = fused_head(target)
    head.save(tmp_path / "head")
    loaded = FeatureHead.load(tmp_path / "head")
    assert loaded.config == head.config and loaded.config.fused_layers == (0, 1)
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    with pytest.raises(ValueError, match=r"feature rows of width 20: this head reads 32 \(a prediction\) or 96"):
        head.fold(torch.zeros(2, 20))


@pytest.mark.parametrize("engine", ["hf", "gguf"])
def test_greedy_identity_of_a_fused_head_with_every_k(target, gguf_target, engine):
    if engine == "gguf":
        session = LeanLM(gguf_target, max_length=64)
        model, vocab = session, 64
        new_target = lambda: LeanLM(gguf_target, max_length=64)  # noqa: E731
        head = untrained_head(session, seed=1, fused_layers=LAYERS)
        with torch.no_grad():
            head.fuse.weight.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    else:
        model, vocab, head = target, 64, fused_head(target)
        new_target = lambda: target  # noqa: E731
    g = torch.Generator().manual_seed(4)
    drafted = 0
    for n in (3, 9):
        prompt = torch.randint(2, vocab, (1, n), generator=g)
        baseline = generate_baseline(new_target(), prompt, 12).tokens
        for k in (1, 2, 4):
            result = generate_speculative(new_target(), FeatureHeadDraft(head, model), prompt, k, 12)
            assert result.tokens == baseline, (engine, n, k)
            drafted += result.drafted
    assert drafted > 0


def test_the_cache_after_a_block_equals_a_fresh_catch_up_with_fused_layers(target):
    head, sampling = fused_head(target, seed=3), SamplingConfig(0.9)
    prompt = [5, 9, 2, 7, 5, 9]
    draft, session = FeatureHeadDraft(head, target), CachedLM(target)
    draft.attach_target(session)
    assert session.feature_layers == (0, 1)  # the loop's session keeps what the head fuses
    session.extend(prompt, 1)
    draft.prefill(prompt)
    context = prompt + [3]
    draft.propose(context, 3, sampling, torch.Generator().manual_seed(0))
    session.extend([3, 11, 12], 3)
    session.crop(len(context) + 1)
    context = context + [11, 40]
    draft.rollback(len(context) - 1)
    again = draft.propose(context, 3, sampling, torch.Generator().manual_seed(1))
    expected = proposal(head, target, context, sampling, seed=1)
    assert again.tokens == expected.tokens
    torch.testing.assert_close(again.q, expected.q, rtol=0, atol=1e-6)


def test_unrolled_training_of_a_fused_head_sees_what_drafting_sees():
    """Depth 0 reads the target's rows folded, deeper depths the head's own predictions: as a cache fed the target's
    rows up to a block's start, then its predictions (to 1e-5); and the layers change the predictions."""
    target = tiny_qwen2(vocab_size=64, num_layers=3, seed=0, dtype=torch.float32)
    parts, head = TargetParts(target), fused_head(target, seed=4, scale=2.0)
    ids = torch.tensor([3, 9, 4, 1, 8, 30, 2, 17, 5, 11])
    final, layers = hf_layers(target, ids.tolist())
    rows = torch.cat([final, layers[0], layers[1]], dim=1)
    embeddings, positions = parts.embed(ids[1:]), torch.arange(1, len(ids))
    with torch.no_grad():
        by_hand = final + head.fuse(torch.cat([norm(layer) for norm, layer in zip(head.layer_norms, layers)], -1))
        torch.testing.assert_close(head.fold(rows), by_hand, rtol=0, atol=1e-6)
        assert torch.equal(head.fold(final), final)  # a prediction's row, read as it is
        depths = unrolled_predictions(head, parts, rows[:-1], embeddings, positions, 3)
        for start in range(len(positions) - 2):
            cache = HeadCache()
            predicted = parts.norm(head(rows[None, :start + 1], embeddings[None, :start + 1], positions[:start + 1],
                                        cache)[0, -1])
            torch.testing.assert_close(depths[0][start], predicted, rtol=0, atol=1e-5)
            for d in range(1, 3):
                row = start + d
                predicted = parts.norm(head(predicted[None, None], embeddings[None, row:row + 1],
                                            positions[row:row + 1], cache)[0, -1])
                torch.testing.assert_close(depths[d][row], predicted, rtol=0, atol=1e-5, msg=f"depth {d} row {row}")
        alone = unrolled_predictions(head, parts, final[:-1], embeddings, positions, 1)[0]
        assert (alone - depths[0]).abs().max() > 1e-3  # the final hidden state alone is not what it reads
    feature_loss, token_loss = head_losses(head, parts, rows, ids, noise=0.02, generator=torch.Generator(), depths=3)
    assert feature_loss > 0 and token_loss > 0
    greedy = greedy_blocks(head, parts, rows, ids, 3)
    assert greedy.shape == (len(ids) - 4, 3)


def test_head_data_with_layers_says_which_and_training_refuses_other_layers(target, tmp_path):
    texts = pd.DataFrame({"prompt_id": ["r", "s"], "input_ids": [[3, 9, 4, 1, 8, 30, 2], [5, 6, 7, 8, 9]]})
    head_data(CachedLM(target), texts, 0, tmp_path / "layers", tmp_path / "parts", {"model": "tiny"},
              log=lambda _: None, layers=LAYERS)
    head_data(CachedLM(target), texts, 0, tmp_path / "plain", tmp_path / "parts", {"model": "tiny"},
              log=lambda _: None)
    assert json.loads((tmp_path / "layers" / LAYERS_FILE).read_text()) == LAYERS
    assert not (tmp_path / "plain" / LAYERS_FILE).exists()
    ids, rows = load_head_data(tmp_path / "layers", layers=LAYERS)
    final, layers = hf_layers(target, ids[0])
    h = final.shape[1]
    torch.testing.assert_close(rows[0][:, :h], final.half(), rtol=0, atol=2e-3)
    for i in LAYERS:  # each layer's output kept at an RMS of 1 (fp16-safe; the head RMS-norms it anyway)
        kept = rows[0][:, (i + 1) * h:(i + 2) * h].float()
        expected = (layers[i] / layers[i].pow(2).mean(-1, keepdim=True).sqrt()).float()
        torch.testing.assert_close(kept, expected, rtol=0, atol=4e-3)
    with pytest.raises(ValueError, match=r"holds the outputs of target layers \[\] beside its features; the head fuses "
                                         r"\[0, 1\]"):
        load_head_data(tmp_path / "layers", tmp_path / "plain", layers=LAYERS)
    ids_alone, alone = load_head_data(tmp_path / "layers")  # a head fusing none reads the final hidden states
    assert ids_alone == ids and all(torch.equal(a, r[:, :h]) for a, r in zip(alone, rows))
    assert [r.shape[1] for r in load_head_data(tmp_path / "layers", layers=[1])[1]] == [2 * h, 2 * h]
    head = with_fused_layers(untrained_head(target, seed=2), LAYERS)  # in the target's dtype, as training has it
    settings = FeatureHeadSettings(steps=2, batch_size=2, unroll=2, vocab=None, fused_layers=LAYERS)
    curve = train_feature_head(head, TargetParts(target), rows, ids, settings, log=lambda _: None)
    assert curve["loss"].notna().all() and head.fuse.weight.abs().max() > 0  # the fusion learns from zero
    with pytest.raises(DraftSpecError, match="training fused_layers \\[1, 0\\]: increasing distinct"):
        FeatureHeadSettings(fused_layers=[1, 0])


# --- exactness: the law of the output with a fused head, and a wrong rule rejected -----------------------------------
def test_a_fused_head_keeps_the_target_law_and_a_wrong_rule_is_rejected(monkeypatch):
    import specdec.decode as decode

    sampling, prompt, length, k, samples = SamplingConfig(1.0, top_k=6), [1, 5, 2, 1, 5], 3, 3, 1500
    target_model = tiny_qwen2(vocab_size=8, hidden_size=16, num_layers=2, seed=3, init_std=0.3)
    memo = PrefixMemoLM(target_model, eos_token_ids=())
    head = fused_head(target_model, seed=4, vocab=[0, 1, 2, 5, 6])
    exact = exact_first_tokens(memo, prompt, sampling, length)

    def draws(n):
        return [tuple(generate_speculative(memo, FeatureHeadDraft(head, target_model), torch.tensor([prompt]), k,
                                           length, sampling.temperature, sampling.top_k, seed=seed).tokens)
                for seed in range(n)]

    fit = chi_square_gof(draws(samples), exact)
    assert fit.impossible == 0 and fit.p_value > 0.01, fit

    def accept_all(p, q, draft_tokens, generator):
        n = draft_tokens.shape[0]
        return n, int(torch.multinomial(p[n].double(), 1, generator=generator))

    monkeypatch.setattr(decode, "_speculative_step_unchecked", accept_all)
    wrong = chi_square_gof(draws(samples // 10), exact)
    assert wrong.p_value < 0.01, wrong


def test_heads_fusing_different_layers_read_their_own_columns_of_shared_rows():
    """head_agreement keeps the union of the heads' layers once; each head reads the final hidden state and its own
    layers' columns, and the table equals each head's greedy_blocks on rows made with only its layers."""
    from specdec.study.training.feature_head import layer_columns, self_distilled
    from specdec.study.training.head_agreement import agreement_table

    rows = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 12)  # final, layers 0, 1, 2; width 3
    assert layer_columns(rows, [0, 1, 2], [2], 3).tolist() == [[0, 1, 2, 9, 10, 11], [12, 13, 14, 21, 22, 23]]
    assert torch.equal(layer_columns(rows, [0, 1, 2], [], 3), rows[:, :3])
    with pytest.raises(ValueError, match=r"a head fuses layers \[3\]; the rows hold \[0, 1, 2\]"):
        layer_columns(rows, [0, 1, 2], [3], 3)
    target = tiny_qwen2(vocab_size=64, num_layers=3, seed=0, dtype=torch.float32)  # as the GGUF engine's parts
    plain, fused = untrained_head(target, seed=1), fused_head(target, seed=2)
    parts, ids = TargetParts(target), [3, 9, 4, 1, 8, 30, 2, 17, 5, 11, 6, 7]
    answers = [("code", *self_distilled(CachedLM(target), ids, 0, [0, 1, 2]))]
    answers = [(domain, row_ids, 4, features.float()) for domain, row_ids, features in answers]
    table = agreement_table(parts, {"plain": plain, "fused": fused}, answers, 3, [0, 1, 2])
    for name, head, layers in [("plain", plain, []), ("fused", fused, LAYERS)]:
        _, alone = self_distilled(CachedLM(target), ids, 0, layers)
        blocks = greedy_blocks(head, parts, alone.float(), torch.tensor(ids), 3)[3:]
        accepted = blocks.int().cumprod(1).sum(0).tolist()
        assert table[table["head"] == name]["accepted"].tolist() == accepted, name


def test_answers_read_again_in_steps_are_the_bits_their_generation_computed(gguf_target, tmp_path):
    """The *_layers data of the answers: each answer's text read again (no generation), its prompt in one forward and
    the rest in passes of up to 32 rows, gives the features generation kept, bit for bit (the lean engine is
    batch-invariant up to 32 rows), with the layers' outputs beside them."""
    g = torch.Generator().manual_seed(6)
    prompts = pd.DataFrame({"prompt_id": ["a", "b"],
                            "input_ids": [torch.randint(2, 64, (n,), generator=g).tolist() for n in (40, 5)]})
    session = LeanLM(gguf_target, max_length=128)
    session.eos_token_ids = frozenset()  # answers of the full length, past one 32-row pass
    head_data(session, prompts, 45, tmp_path / "answers", tmp_path / "parts", {"model": "tiny"}, log=lambda _: None)
    generated = pd.read_parquet(tmp_path / "answers" / "sequences.parquet")
    head_data(LeanLM(gguf_target, max_length=128), generated, 0, tmp_path / "again", tmp_path / "parts",
              {"model": "tiny"}, log=lambda _: None, layers=[1], stepped=True)
    ids, kept = load_head_data(tmp_path / "answers")
    ids_again, rows = load_head_data(tmp_path / "again", layers=[1])
    assert ids_again == ids and len(ids[0]) == 40 + 44
    h = kept[0].shape[1]
    for a, b in zip(kept, rows):
        assert torch.equal(a, b[:, :h]) and b.shape[1] == 2 * h
