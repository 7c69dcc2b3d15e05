"""Distillation of a shallow draft: teacher data, the loss, training that lowers it, and resume from checkpoints."""

import pandas as pd
import pytest
import torch

from specdec.study.training.distill import (
    DistillSettings,
    distill,
    distillation_loss,
    teacher_data,
)
from specdec.testing import tiny_qwen2


def _setup():
    target = tiny_qwen2(vocab_size=64, hidden_size=32, num_layers=2, seed=0, dtype=torch.float32, init_std=0.3)
    prompts = pd.DataFrame({"prompt_id": [f"p{i}" for i in range(4)],
                            "input_ids": [[3, 10 + i, 20, 30 + i, 11] for i in range(4)]})
    sequences, tensors = teacher_data(target, prompts, new_tokens=6, top_k=8, log=lambda _: None)
    return target, sequences, tensors


def _student(seed=1):
    return tiny_qwen2(vocab_size=64, hidden_size=32, num_layers=1, seed=seed, dtype=torch.float32, init_std=0.3)


def test_teacher_data_holds_the_targets_distributions():
    target, sequences, tensors = _setup()
    row = sequences.iloc[0]
    assert len(row["input_ids"]) == row["n_prompt"] + 6 and tensors["indices_0"].shape == (6, 8)
    with torch.inference_mode():
        logits = target(input_ids=torch.tensor([list(row["input_ids"])])).logits[0]
    expected = torch.log_softmax(logits[row["n_prompt"] - 1:-1], dim=-1).topk(8, dim=-1)
    torch.testing.assert_close(tensors["logprobs_0"], expected.values)
    # greedy continuation: each generated token is the teacher's top-1 at its position
    assert tensors["indices_0"][:, 0].tolist() == list(row["input_ids"])[row["n_prompt"]:]


def test_loss_is_zero_only_for_the_teachers_distribution():
    logits = torch.randn(3, 16)
    top = torch.log_softmax(logits, dim=-1).topk(16, dim=-1)  # the full support: exact KL
    assert distillation_loss(logits, top.indices, top.values).item() == pytest.approx(0.0, abs=1e-6)
    assert distillation_loss(torch.randn(3, 16), top.indices, top.values).item() > 0.01


def test_training_lowers_the_loss():
    _, sequences, tensors = _setup()
    student = _student()
    curve = distill(student, sequences, tensors, DistillSettings(steps=40, batch_size=2, learning_rate=3e-3,
                                                                 train_head=True), log=lambda _: None)
    assert len(curve) == 40
    assert curve["loss"].tail(5).mean() < 0.7 * curve["loss"].head(5).mean()
    assert not any(p.requires_grad for p in student.parameters())  # back to inference


def test_interrupted_training_resumes_to_the_same_weights(tmp_path):
    _, sequences, tensors = _setup()
    settings = DistillSettings(steps=4, batch_size=2, learning_rate=1e-3, checkpoint_every=2)
    straight = _student()
    distill(straight, sequences, tensors, settings, log=lambda _: None)
    resumed = _student()
    first_half = DistillSettings(**{**settings.__dict__, "steps": 2})
    distill(resumed, sequences, tensors, first_half, tmp_path / "ckpt", log=lambda _: None)  # "killed" after step 2
    fresh = _student()  # a new process starts from the initial weights and finds the checkpoint
    curve = distill(fresh, sequences, tensors, settings, tmp_path / "ckpt", log=lambda _: None)
    assert list(curve["step"]) == [1, 2, 3, 4]
    for a, b in zip(straight.parameters(), fresh.parameters()):
        torch.testing.assert_close(a, b)
