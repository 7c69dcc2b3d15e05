"""The feature-level draft head: the sessions' features, the proposer's bookkeeping, a reduced drafting vocabulary
kept exact, and training that teaches it. The registry's shared checks (greedy identity, q-law, end-to-end law with
a wrong rule rejected) run on it in tests/test_registry.py like on every kind."""

from __future__ import annotations

import copy
from dataclasses import replace

import pandas as pd

import pytest
import torch

import specdec.decode as decode
from specdec.decode import generate_baseline, generate_speculative
from specdec.drafts.feature_head import FeatureHead, FeatureHeadDraft, HeadCache, TargetParts, untrained_head
from specdec.errors import DraftSpecError
from specdec.lm import CachedLM, PrefixMemoLM
from specdec.sampling import SamplingConfig
from specdec.study.verify.distribution import exact_first_tokens
from specdec.study.training.feature_head import (
    FeatureHeadSettings,
    drafting_vocabulary,
    greedy_blocks,
    head_data,
    head_losses,
    load_head_data,
    settings_from_config,
    target_features,
    train_feature_head,
    train_head_for,
    unrolled_mask,
    unrolled_predictions,
)
from specdec.study.stats import chi_square_gof
from specdec.testing import tiny_qwen2


@pytest.fixture(scope="module")
def target():
    return tiny_qwen2(vocab_size=64, num_layers=2, seed=0)


def full_features(model, ids):
    with torch.no_grad():
        return model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]


@pytest.mark.parametrize("session_type", [CachedLM, PrefixMemoLM])
def test_a_session_keeps_the_features_of_every_position_through_crops(target, session_type):
    ids = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    session = session_type(target)
    session.keep_hidden_states()
    session.extend(ids[:5], 1)
    session.extend([7, 8, 9], 3)  # a rejected block
    session.crop(5)
    session.extend(ids[5:9], 2)
    session.extend(ids[9:], 1)
    torch.testing.assert_close(session.hidden_states(0, 12), full_features(target, ids), rtol=0, atol=1e-12)
    torch.testing.assert_close(session.hidden_states(3, 7), full_features(target, ids)[3:7], rtol=0, atol=1e-12)
    with pytest.raises(IndexError, match=r"positions 10\.\.12 asked"):
        session.hidden_states(10, 13)
    session.reset()
    session.extend(ids[:2], 1)
    torch.testing.assert_close(session.hidden_states(0, 2), full_features(target, ids[:2]), rtol=0, atol=1e-12)


def test_features_are_not_kept_unless_asked(target):
    session = CachedLM(target)
    session.extend([1, 2, 3], 1)
    with pytest.raises(RuntimeError, match="keep_hidden_states"):
        session.hidden_states(0, 1)
    session.keep_hidden_states()  # from position 3 on: the first three were computed without
    session.extend([4], 1)
    torch.testing.assert_close(session.hidden_states(3, 4), full_features(target, [1, 2, 3, 4])[3:], rtol=0,
                               atol=1e-12)
    with pytest.raises(IndexError, match="kept from position 3 on"):
        session.hidden_states(2, 4)


def test_a_target_without_features_is_refused_by_name(target):
    class Bare:
        vocab_size, eos_token_ids = 64, frozenset()

        def reset(self): ...
        def extend(self, tokens, n): ...
        def crop(self, n): ...

    with pytest.raises(TypeError, match="Bare does not expose them"):
        generate_speculative(Bare(), FeatureHeadDraft(untrained_head(target), target), torch.tensor([[1, 2]]), 2, 4)


def test_the_head_cache_after_a_block_equals_a_fresh_catch_up(target):
    """After verify and rollback the head holds only positions fed with the target's features: its next proposal
    (tokens and q) equals that of a new proposer catching up on the same context from nothing."""
    head = untrained_head(target, seed=3)
    sampling = SamplingConfig(0.9)
    prompt = [5, 9, 2, 7, 5, 9]
    draft = FeatureHeadDraft(head, target)
    session = CachedLM(target)
    draft.attach_target(session)
    session.extend(prompt, 1)
    draft.prefill(prompt)
    context = prompt + [3]
    draft.propose(context, 3, sampling, torch.Generator().manual_seed(0))
    assert draft._cache.length == len(context) - 1 + 2  # true positions 1..6, then two drafted ones
    session.extend([3, 11, 12], 3)  # verify two of the three, keep one: context grows by [11, 40]
    session.crop(len(context) + 1)
    context = context + [11, 40]
    draft.rollback(len(context) - 1)
    assert draft._cache.length == len(prompt)  # the drafted positions are dropped
    again = draft.propose(context, 3, sampling, torch.Generator().manual_seed(1))

    fresh_session = CachedLM(target)
    fresh = FeatureHeadDraft(head, target)
    fresh.attach_target(fresh_session)
    fresh_session.extend(context[:-1], 1)
    fresh.prefill(context[:-1])
    expected = fresh.propose(context, 3, sampling, torch.Generator().manual_seed(1))
    assert again.tokens == expected.tokens
    torch.testing.assert_close(again.q, expected.q, rtol=0, atol=1e-6)
    assert again.catchup_tokens == 2 and expected.catchup_tokens == len(context) - 1


@pytest.mark.parametrize("vocab", [None, 40])
def test_greedy_identity_with_every_k_and_a_reduced_vocabulary(target, vocab):
    head = untrained_head(target, None if vocab is None else range(0, 64, 64 // vocab + 1), seed=1)
    g = torch.Generator().manual_seed(2)
    drafted = 0
    for n in (2, 5, 9):
        ids = torch.randint(0, 64, (1, n), generator=g)
        baseline = generate_baseline(target, ids, 14).tokens
        for k in (1, 2, 4):
            result = generate_speculative(target, FeatureHeadDraft(head, target), ids, k, 14)
            assert result.tokens == baseline, (n, k)
            drafted += result.drafted
    assert drafted > 0


def test_q_is_zero_outside_the_drafting_vocabulary(target):
    vocab = list(range(10, 30))
    draft = FeatureHeadDraft(untrained_head(target, vocab), target)
    session = CachedLM(target)
    draft.attach_target(session)
    session.extend([1, 2, 3], 1)
    draft.prefill([1, 2, 3])
    proposal = draft.propose([1, 2, 3, 4], 3, SamplingConfig(1.0), torch.Generator().manual_seed(0))
    outside = torch.ones(64, dtype=torch.bool)
    outside[vocab] = False
    assert (proposal.q[:, outside] == 0).all() and set(proposal.tokens) <= set(vocab)
    torch.testing.assert_close(proposal.q.sum(-1).double(), torch.ones(3, dtype=torch.float64))


# --- exactness with a reduced vocabulary: the law of the output, and a wrong rule rejected ---------------------------
VOCAB, LENGTH, K, SAMPLES = 8, 3, 3, 1500
SAMPLING = SamplingConfig(1.0, top_k=6)
PROMPT = [1, 5, 2, 1, 5]


def _samples(target_model, memo, head, samples):
    prompt = torch.tensor([PROMPT])
    return [tuple(generate_speculative(memo, FeatureHeadDraft(head, target_model), prompt, K, LENGTH,
                                       SAMPLING.temperature, SAMPLING.top_k, seed=seed).tokens)
            for seed in range(samples)]


def test_a_reduced_vocabulary_keeps_the_target_law_and_a_wrong_rule_is_rejected(monkeypatch):
    target_model = tiny_qwen2(vocab_size=VOCAB, hidden_size=16, seed=3, init_std=0.3)
    memo = PrefixMemoLM(target_model, eos_token_ids=())
    head = untrained_head(target_model, [0, 1, 2, 5, 6], seed=4)  # tokens 3, 4, 7 are never drafted
    exact = exact_first_tokens(memo, PROMPT, SAMPLING, LENGTH)
    fit = chi_square_gof(_samples(target_model, memo, head, SAMPLES), exact)
    assert fit.impossible == 0 and fit.p_value > 0.01, fit

    def accept_all(p, q, draft_tokens, generator):
        k = draft_tokens.shape[0]
        return k, int(torch.multinomial(p[k].double(), 1, generator=generator))

    monkeypatch.setattr(decode, "_speculative_step_unchecked", accept_all)
    wrong = chi_square_gof(_samples(target_model, memo, head, SAMPLES // 10), exact)
    print(f"correct: p = {fit.p_value:.3g}; every draft token accepted: p = {wrong.p_value:.3g}")
    assert wrong.p_value < 0.01, wrong


# --- saving, the drafting vocabulary, training ----------------------------------------------------------------------
def test_save_and_load_keep_every_weight_bit_for_bit(target, tmp_path):
    head = untrained_head(target, range(7, 50), seed=5)
    head.save(tmp_path / "head", steps=3)
    loaded = FeatureHead.load(tmp_path / "head")
    assert loaded.state_dict().keys() == head.state_dict().keys()
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    with pytest.raises(FileNotFoundError, match="holds no feature head"):
        FeatureHead.load(tmp_path / "nothing")


def test_a_head_refuses_ids_outside_the_vocabulary(target):
    with pytest.raises(ValueError, match="distinct token ids in 0..63"):
        untrained_head(target, [3, 64])
    with pytest.raises(ValueError, match="distinct"):
        untrained_head(target, [3, 3])


def test_the_drafting_vocabulary_is_the_most_frequent_tokens():
    sequences = [[5, 5, 5, 2, 2, 9], [2, 7, 5]]
    assert drafting_vocabulary(sequences, 2, 10) == [2, 5]
    assert drafting_vocabulary(sequences, 3, 10) == [2, 5, 7]  # 7 and 9 tie: the lower id
    assert drafting_vocabulary(sequences, 6, 10) == [0, 1, 2, 5, 7, 9]  # unseen ids fill up, lowest first
    assert drafting_vocabulary(sequences, None, 4) == [0, 1, 2, 3]


def _self_distilled(target, n, length, seed):
    g = torch.Generator().manual_seed(seed)
    sequences = []
    for _ in range(n):
        prompt = torch.randint(0, 64, (1, 4), generator=g)
        sequences.append(prompt[0].tolist() + generate_baseline(target, prompt, length).tokens)
    return sequences


def test_head_data_is_the_targets_answers_with_its_features_and_resumes_part_by_part(target, tmp_path):
    g = torch.Generator().manual_seed(3)
    prompts = pd.DataFrame({"prompt_id": ["a", "b", "c"],
                            "input_ids": [torch.randint(0, 64, (n,), generator=g).tolist() for n in (3, 5, 4)]})
    out, parts, lines = tmp_path / "data", tmp_path / "parts", []
    head_data(CachedLM(target), prompts, 6, out, parts, {"model": "tiny"}, part_size=2, log=lines.append)
    ids, features = load_head_data(out)
    assert not parts.exists() and len(lines) == 3
    for prompt, row, kept in zip(prompts["input_ids"], ids, features):
        answer = generate_baseline(target, torch.tensor([prompt]), 6).tokens
        assert row == prompt + answer[:-1]  # the last token's feature was never computed
        assert kept.dtype == torch.float16
        torch.testing.assert_close(kept, full_features(target, row).half(), rtol=0, atol=2e-3)
    # interrupted in the second part: the rerun makes only that part's prompt, to the same data
    class Interrupted(CachedLM):
        def extend(self, tokens, n_logits):
            if tokens[:3] == prompts["input_ids"][2][:3]:
                raise KeyboardInterrupt
            return super().extend(tokens, n_logits)

    with pytest.raises(KeyboardInterrupt):
        head_data(Interrupted(target), prompts, 6, tmp_path / "again", parts, {"model": "tiny"}, part_size=2,
                  log=lambda _: None)
    assert sorted(f.name for f in parts.iterdir()) == ["key.json", "part_0000.safetensors"]
    lines.clear()
    head_data(CachedLM(target), prompts, 6, tmp_path / "again", parts, {"model": "tiny"}, part_size=2,
              log=lines.append)
    assert len(lines) == 1 and lines[0].startswith("[3/3] c")
    assert load_head_data(tmp_path / "again")[0] == ids
    # parts made for another model are discarded, not reused
    parts.mkdir()
    (parts / "key.json").write_text("{}")
    (parts / "part_0000.safetensors").write_bytes(b"stale")
    lines.clear()
    head_data(CachedLM(target), prompts, 6, out, parts, {"model": "tiny"}, part_size=2, log=lines.append)
    assert lines[0].endswith("starting over") and len(lines) == 4


def test_text_read_through_keeps_every_positions_features_and_two_data_sets_load_in_order(target, tmp_path):
    g = torch.Generator().manual_seed(4)
    texts = pd.DataFrame({"prompt_id": ["r", "s"], "n_prompt": [2, 3],
                          "input_ids": [torch.randint(0, 64, (n,), generator=g).tolist() for n in (7, 5)]})
    lines = []
    head_data(CachedLM(target), texts, 0, tmp_path / "read", tmp_path / "parts", {"model": "tiny"}, log=lines.append)
    ids, features = load_head_data(tmp_path / "read")
    assert ids == texts["input_ids"].tolist()  # read, nothing generated, nothing dropped
    assert lines[0].endswith("7 positions read (" + lines[0].split("(")[-1])
    assert pd.read_parquet(tmp_path / "read/sequences.parquet")["n_prompt"].tolist() == [2, 3]
    for row, kept in zip(ids, features):
        torch.testing.assert_close(kept, full_features(target, row).half(), rtol=0, atol=2e-3)
    answers = pd.DataFrame({"prompt_id": ["a"], "input_ids": [[5, 6, 7]]})
    head_data(CachedLM(target), answers, 4, tmp_path / "answers", tmp_path / "parts", {"model": "tiny"},
              log=lambda _: None)
    both_ids, both_features = load_head_data(tmp_path / "answers", tmp_path / "read")
    assert both_ids == load_head_data(tmp_path / "answers")[0] + ids and len(both_features) == 3
    assert torch.equal(both_features[2], features[1])


def test_the_cosine_schedule_warms_up_then_falls_to_zero_and_unknown_settings_are_named():
    settings = FeatureHeadSettings(steps=110, warmup=10, learning_rate=1e-3, schedule="cosine")
    rates = [settings.learning_rate_at(step) for step in range(110)]
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3)  # linear warm-up
    assert rates[59] == pytest.approx(5e-4) and rates[-1] == pytest.approx(0, abs=1e-12)  # half-way, end
    assert all(a >= b for a, b in zip(rates[9:], rates[10:]))
    constant = FeatureHeadSettings(steps=110, warmup=10, learning_rate=1e-3)
    assert [constant.learning_rate_at(s) for s in (9, 109)] == [1e-3, 1e-3]
    with pytest.raises(DraftSpecError, match="training schedule 'linear': one of \\['constant', 'cosine'\\]"):
        FeatureHeadSettings(schedule="linear")
    with pytest.raises(DraftSpecError,
                       match="config key 'draft_kinds.h.training': unknown setting\\(s\\) \\['epochs'\\]"):
        settings_from_config({"epochs": 3, "init": "other", "data": ["answers", "corpus"]}, "draft_kinds.h")
    assert settings_from_config({"init": "other", "data": ["answers", "corpus"]}, "k").data == ("answers", "corpus")


def test_training_can_start_from_a_trained_head_keeping_its_vocabulary(target):
    sequences = _self_distilled(target, 3, 6, seed=5)
    features = [target_features(target, [ids], log=lambda _: None)["features_0"] for ids in sequences]
    first = untrained_head(target, [1, 2, 3, 5, 8, 13, 21, 34], seed=3)
    settings = FeatureHeadSettings(steps=0, vocab=4, init="first")
    same, _ = train_head_for(target, sequences, features, settings, init=copy.deepcopy(first))
    assert torch.equal(same.draft_vocab, first.draft_vocab)  # not the data's 4 most frequent tokens
    for name, tensor in first.state_dict().items():
        assert torch.equal(same.state_dict()[name], tensor), name
    trained, curve = train_head_for(target, sequences, features, replace(settings, steps=2), init=copy.deepcopy(first))
    assert len(curve) == 2 and not torch.equal(trained.fc.weight, first.fc.weight)
    wider = tiny_qwen2(vocab_size=64, num_layers=2, seed=0, hidden_size=48)
    with pytest.raises(DraftSpecError, match="the head to start from was made for another target"):
        train_head_for(wider, sequences, features, settings, init=copy.deepcopy(first))


def _acceptance(target, head, sequences, k=3):
    drafted = accepted = 0
    for ids in sequences:
        result = generate_speculative(target, FeatureHeadDraft(head, target), torch.tensor([ids[:4]]), k, 16)
        drafted, accepted = drafted + result.drafted, accepted + result.accepted
    return accepted / drafted


def test_training_on_the_targets_answers_raises_acceptance(target):
    sequences = _self_distilled(target, 12, 20, seed=0)
    features = [target_features(target, [ids], log=lambda _: None)["features_0"] for ids in sequences]
    assert features[0].dtype == torch.float16 and features[0].shape == (len(sequences[0]), 32)
    head = untrained_head(target, drafting_vocabulary(sequences, 48, 64), seed=0).float()
    target32 = tiny_qwen2(vocab_size=64, num_layers=2, seed=0, dtype=torch.float32)
    before = _acceptance(target32, head, sequences)
    settings = FeatureHeadSettings(steps=150, batch_size=4, learning_rate=3e-3, warmup=10, vocab=48)
    curve = train_feature_head(head, TargetParts(target32), features, sequences, settings, log=lambda _: None)
    assert curve["loss"].iloc[-10:].mean() < 0.5 * curve["loss"].iloc[:10].mean()
    after = _acceptance(target32, head, sequences)
    print(f"acceptance before {before:.2f}, after {after:.2f}")
    assert after > before + 0.2


def test_offline_greedy_blocks_accept_what_greedy_decoding_accepts():
    """greedy_blocks' row s is the block decoding runs after the prompt ids[:s + 1] (whose prefill emits ids[s + 1]):
    its leading trues are that block's accepted drafts, for every s past the random 4-token prompt."""
    target = tiny_qwen2(vocab_size=64, num_layers=2, seed=0, dtype=torch.float32)
    sequences = _self_distilled(target, 8, 24, seed=7)
    features = [target_features(target, [ids], log=lambda _: None)["features_0"] for ids in sequences]
    head = untrained_head(target, drafting_vocabulary(sequences, 48, 64), seed=0).float()
    train_feature_head(head, TargetParts(target), features, sequences,
                       FeatureHeadSettings(steps=60, batch_size=4, learning_rate=3e-3, warmup=10), log=lambda _: None)
    ids, k = sequences[0], 3
    blocks = greedy_blocks(head, TargetParts(target), full_features(target, ids), torch.tensor(ids), k)
    assert blocks.shape == (len(ids) - k - 1, k) and 0 < blocks.float().mean() < 1  # both outcomes occur
    leading = blocks.int().cumprod(1).sum(1)
    for s in range(3, len(blocks)):
        result = generate_speculative(target, FeatureHeadDraft(head, target), torch.tensor([ids[:s + 1]]), k, k + 2)
        assert result.tokens[0] == ids[s + 1]
        assert result.steps[1].accepted == leading[s], f"block after position {s + 1}"


def test_an_interrupted_training_resumes_to_the_same_weights(target, tmp_path):
    sequences = _self_distilled(target, 3, 6, seed=1)
    features = [target_features(target, [ids], log=lambda _: None)["features_0"] for ids in sequences]
    settings = FeatureHeadSettings(steps=4, batch_size=2, checkpoint_every=2, vocab=None)
    whole = untrained_head(target, seed=2)
    train_feature_head(whole, TargetParts(target), features, sequences, settings, log=lambda _: None)
    half = untrained_head(target, seed=2)
    train_feature_head(half, TargetParts(target), features, sequences, replace(settings, steps=2),
                       tmp_path / "ckpt", log=lambda _: None)
    resumed = untrained_head(target, seed=9)  # other initial weights: the checkpoint replaces them
    curve = train_feature_head(resumed, TargetParts(target), features, sequences, settings, tmp_path / "ckpt",
                               log=lambda _: None)
    assert list(curve["step"]) == [1, 2, 3, 4]
    for name, tensor in whole.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], tensor, rtol=0, atol=1e-12, msg=name)


def test_head_losses_are_zero_only_for_a_perfect_prediction(target):
    ids = torch.tensor([3, 9, 4, 1, 8])
    features = full_features(target, ids.tolist())
    head = untrained_head(target)
    feature_loss, token_loss = head_losses(head, TargetParts(target), features, ids)
    assert feature_loss > 0 and token_loss > 0
    assert HeadCache().length == 0


def test_unrolled_training_sees_what_drafting_sees_depth_by_depth():
    """Depth d of the unrolled forward, at row r, is drafting's d-th step of a block that started at row r - d: the
    same predicted feature as a cache fed true features up to r - d, then the head's own predictions (to 1e-5)."""
    target = tiny_qwen2(vocab_size=64, num_layers=2, seed=0, dtype=torch.float32)
    parts, head = TargetParts(target), untrained_head(target, seed=4).float()
    torch.manual_seed(0)
    for p in head.parameters():  # far from the initialisation's near-identity, so that every depth differs
        p.data.add_(0.2 * torch.randn_like(p))
    ids = torch.tensor([3, 9, 4, 1, 8, 30, 2, 17, 5, 11])
    features = full_features(target, ids.tolist())
    embeddings, positions = parts.embed(ids[1:]), torch.arange(1, len(ids))
    with torch.no_grad():
        depths = unrolled_predictions(head, parts, features[:-1], embeddings, positions, 4)
        for start in range(len(positions) - 3):
            cache = HeadCache()
            out = head(features[None, :start + 1], embeddings[None, :start + 1], positions[:start + 1], cache)
            predicted = parts.norm(out[0, -1])
            torch.testing.assert_close(depths[0][start], predicted, rtol=0, atol=1e-5)
            for d in range(1, 4):
                row = start + d
                out = head(predicted[None, None], embeddings[None, row:row + 1], positions[row:row + 1], cache)
                predicted = parts.norm(out[0, -1])
                torch.testing.assert_close(depths[d][row], predicted, rtol=0, atol=1e-5, msg=f"depth {d} row {row}")
                assert (depths[d][row] - depths[0][row]).abs().max() > 1e-3  # a depth of its own, not depth 0's
    assert unrolled_mask(4, 0).equal(torch.ones(4, 4, dtype=torch.bool).tril())
    assert unrolled_mask(4, 2)[3].tolist() == [1, 1, 0, 0] + [0, 0, 1, 0] + [0, 0, 0, 1]


def test_unrolled_losses_start_with_teacher_forcing_and_unroll_is_checked(target):
    ids = torch.tensor([3, 9, 4, 1, 8, 30, 2, 17])
    features = full_features(target, ids.tolist())
    head, parts = untrained_head(target, seed=1), TargetParts(target)
    one = head_losses(head, parts, features, ids)
    # depth 0 alone is teacher forcing: the head's own causal forward scored against the next features
    rows = parts.head_rows(head.draft_vocab)
    with torch.no_grad():
        predicted = parts.norm(head(features[None, :-1], parts.embed(ids[1:])[None], torch.arange(1, len(ids)))[0])
    assert torch.equal(one[0], torch.nn.functional.smooth_l1_loss(predicted, features[1:]))
    three = head_losses(head, parts, features, ids, depths=3, decay=0.5)
    assert all(a != b for a, b in zip(one, three))
    assert torch.equal(head_losses(head, parts, features, ids, depths=3, decay=0.5)[1], three[1])
    for bad, message in [({"unroll": 0}, "training unroll 0: a whole number"),
                         ({"unroll": 2.5}, "training unroll 2.5"),
                         ({"unroll_decay": 0}, "training unroll_decay 0: a weight in")]:
        with pytest.raises(DraftSpecError, match=message):
            FeatureHeadSettings(**bad)
    settings = FeatureHeadSettings(steps=2, batch_size=2, unroll=3, vocab=None)
    curve = train_feature_head(untrained_head(target, seed=2), parts, [features], [ids.tolist()], settings,
                               log=lambda _: None)
    assert len(curve) == 2 and curve["loss"].notna().all()


def test_a_head_behind_prompt_lookup_keeps_greedy_identity_and_both_draft(target):
    """`lookup: true`: prompt lookup where it finds a match, the head elsewhere; the loop's session reaches the head
    through the hybrid."""
    from specdec.drafts import DraftResources, get_kind

    kind = get_kind("feature_head")
    spec = {"kind": "feature_head", "lookup": True, "ngram_max": 2}
    head = kind.untrained(spec, target)
    g = torch.Generator().manual_seed(4)
    blocks = {"lookup": 0, "head": 0}

    def counted(name, propose):
        def wrapper(*args):
            proposal = propose(*args)
            blocks[name] += len(proposal.tokens) > 0
            return proposal
        return wrapper

    for n in (3, 6):
        plain = torch.randint(0, 64, (n,), generator=g).tolist()
        for prompt in (plain, plain * 3):
            ids = torch.tensor([prompt])
            baseline = generate_baseline(target, ids, 14).tokens
            draft = kind.build(spec, DraftResources(target=target, vocab_size=64, eos_token_ids=frozenset(),
                                                    draft_model=lambda: head))
            draft.lookup.propose = counted("lookup", draft.lookup.propose)
            draft.model.propose = counted("head", draft.model.propose)
            assert generate_speculative(target, draft, ids, 3, 14).tokens == baseline, prompt
    assert blocks["head"] > 0 and blocks["lookup"] > 0, blocks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_drafting_copy_runs_on_the_native_kernels_keeps_identity_and_leaves_the_head_alone(dtype):
    from specdec.fp32.kernels import invariant_kernels_available, linear_backends

    target32 = tiny_qwen2(vocab_size=64, num_layers=2, seed=0, dtype=torch.float32)
    head = untrained_head(target32, range(48), seed=1)
    before = {name: tensor.clone() for name, tensor in head.state_dict().items()}
    draft = FeatureHeadDraft(head, target32, dtype=dtype)
    assert draft.head.fc.weight.dtype == dtype and head.fc.weight.dtype == torch.float32
    if invariant_kernels_available():
        assert linear_backends(draft.head, 1) == ("avx2" if dtype == torch.float32 else "avx2-bf16")
    g = torch.Generator().manual_seed(6)
    drafted = 0
    for n in (2, 7):
        ids = torch.randint(0, 64, (1, n), generator=g)
        result = generate_speculative(target32, FeatureHeadDraft(head, target32, dtype=dtype), ids, 3, 12)
        assert result.tokens == generate_baseline(target32, ids, 12).tokens
        drafted += result.drafted
    assert drafted > 0
    assert all(torch.equal(head.state_dict()[name], tensor) for name, tensor in before.items())


def test_an_lm_head_with_a_bias_is_refused_by_name():
    model = tiny_qwen2(vocab_size=64, num_layers=1, seed=2)
    model.lm_head.bias = torch.nn.Parameter(torch.zeros(64, dtype=model.lm_head.weight.dtype))
    with pytest.raises(TypeError, match="this LM head has a bias"):
        TargetParts(model)


def test_a_q8_0_drafting_copy_runs_the_quantized_product_keeps_identity_and_leaves_the_head_alone():
    """dtype "q8_0": every linear layer of the drafting copy (and the LM head rows) becomes Q8_0 blocks on the
    quantized product, the `gguf` package's quantisation; its logits are the fp32 head's within Q8_0's error (and not
    equal to them: the weights did change), greedy decoding stays the target's, and the trained head is untouched."""
    from specdec.gguf import quant
    from specdec.drafts.feature_head import Q8Linear

    if not quant.available():
        pytest.skip("the quantized product needs specdec.native._quant on an x86 CPU with AVX2")
    target32 = tiny_qwen2(vocab_size=64, num_layers=2, seed=0, dtype=torch.float32)
    head = untrained_head(target32, range(48), seed=1)
    before = {name: tensor.clone() for name, tensor in head.state_dict().items()}
    q8, f32 = (FeatureHeadDraft(head, target32, dtype=d) for d in ("q8_0", torch.float32))
    linears = [name for name, module in head.named_children() if isinstance(module, torch.nn.Linear)]
    assert len(linears) == 8 and all(isinstance(getattr(q8.head, name), Q8Linear) for name in linears)
    assert isinstance(q8._rows, Q8Linear) and q8._rows.weight.qtype == "Q8_0"
    features, tokens = torch.randn(5, 32), torch.tensor([3, 9, 1, 40, 7])
    (_, low), (_, exact) = (d._step(features, tokens, 1, HeadCache()) for d in (q8, f32))
    assert not torch.equal(low, exact) and torch.allclose(low, exact, rtol=0.05, atol=0.05 * exact.abs().max())
    g = torch.Generator().manual_seed(6)
    drafted = 0
    for n in (2, 7):
        ids = torch.randint(0, 64, (1, n), generator=g)
        result = generate_speculative(target32, FeatureHeadDraft(head, target32, dtype="q8_0"), ids, 3, 12)
        assert result.tokens == generate_baseline(target32, ids, 12).tokens
        drafted += result.drafted
    assert drafted > 0
    assert all(torch.equal(head.state_dict()[name], tensor) for name, tensor in before.items())
    with pytest.raises(ValueError, match="a torch dtype or 'q8_0', got 'q4_k'"):
        FeatureHeadDraft(head, target32, dtype="q4_k")


def test_the_agreement_table_counts_blocks_by_draft_position():
    from specdec.study.training.head_agreement import agreement_rows

    blocks = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 1]], dtype=torch.bool)
    rows = agreement_rows("h", "code", [blocks[:2], blocks[2:]])
    assert [(r["position"], r["reached"], r["accepted"]) for r in rows] == [(1, 4, 3), (2, 3, 2), (3, 2, 1)]
    assert [r["tokens_per_pass"] for r in rows] == [1.75, 2.25, 2.5]  # 1 + accepted drafts a block, k = position
    assert rows[1]["rate"] == pytest.approx(2 / 3) and {r["prompts"] for r in rows} == {2}
