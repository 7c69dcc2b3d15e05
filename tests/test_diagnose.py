"""Where two decodings part ways: one first_difference for the greedy check and the llama.cpp stage, with the same
answer at a sequence's end, and a divergence diagnosis that refuses equal sequences and reports a cut-short one."""

import math

import pytest
import torch

from specdec.decode import generate_baseline
from specdec.drafts import ModelDraft
from specdec.study.verify import diagnose
from specdec.study.peers import llamacpp
from specdec.study.verify.diagnose import diagnose_divergence
from specdec.study.verify.divergence import first_difference
from specdec.testing import perturbed_copy, tiny_qwen2


def test_both_callers_share_one_first_difference():
    assert diagnose.first_difference is first_difference and llamacpp.first_difference is first_difference


@pytest.mark.parametrize("a, b, n, expected", [
    ([1, 2, 3], [1, 2, 3], None, None),  # equal: no difference (not their length)
    ([], [], None, None),
    ([1, 2, 3], [1, 5, 3], None, 1),
    ([1, 2], [1, 2, 3], None, 2),  # a strict prefix differs where it ends: the shorter length
    ([1, 2, 3], [1, 2], None, 2),  # in either order
    ([], [7], None, 0),
    ([1, 2, 3, 4], [1, 2, 3, 9], 3, None),  # past n does not count
    ([1, 2], [1, 2, 3], 2, None),  # nor does a length difference past n
    ([1, 2], [1, 2, 3], 3, 2),
])
def test_first_difference_at_a_sequence_end(a, b, n, expected):
    assert first_difference(a, b, n) == expected


def test_diagnosis_refuses_equal_sequences_before_replaying():
    # target and draft are never touched: the refusal comes before the two replays
    with pytest.raises(ValueError, match="equal"):
        diagnose_divergence(None, None, torch.tensor([[3, 4]]), 2, 4, [5, 6, 7], [5, 6, 7])


def test_diagnosis_of_a_cut_short_sequence_names_the_shorter_length():
    target = tiny_qwen2(vocab_size=64, seed=0)
    draft = ModelDraft(perturbed_copy(target, noise=0.05, seed=1))
    ids = torch.tensor([[3, 10, 20, 30]])
    tokens = generate_baseline(target, ids, 6).tokens
    result = diagnose_divergence(target, draft, ids, 2, 6, tokens, tokens[:4])
    assert result["first_diff"] == 4 and not result["near_tie"] and math.isnan(result["margin"])
