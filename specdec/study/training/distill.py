"""Distilling a shallow draft: train a truncated model to match the target's next-token distributions.

Data: the target's own greedy continuations of a training prompt set (disjoint from the evaluation prompts), with
the target's top-K log-probabilities at every continuation position (`teacher_data`). Training (`distill`): the
student's decoder layers and final norm (optionally its LM head) are trained with AdamW to minimise
KL(teacher || student) over the teacher's top-K tokens (teacher renormalised over them, student normalised over the
whole vocabulary, so mass it puts elsewhere is penalised). Checkpoints let an interrupted run resume.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file, save_file

from specdec.decode import generate_baseline
from specdec.study.io import atomic_path, write_text


@dataclass(frozen=True)
class DistillSettings:
    steps: int = 200
    batch_size: int = 4
    max_length: int = 256  # tokens per training sequence (the continuation is kept, the prompt cut from the left)
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    train_head: bool = False
    checkpoint_every: int = 25
    seed: int = 0


# --- teacher data -------------------------------------------------------------------------------------------------
@torch.inference_mode()
def teacher_data(target, prompts: pd.DataFrame, new_tokens: int, top_k: int,
                 log: Callable[[str], None] = print) -> tuple[pd.DataFrame, dict[str, torch.Tensor]]:
    """Greedy continuations of the target and its top-k log-probs at every continuation position.

    Returns (sequences: prompt_id, input_ids (prompt + continuation), n_prompt), and tensors indices_{i} /
    logprobs_{i} of shape (n_continuation, top_k) for sequence i: the target's distribution over the token at
    continuation position j, given everything before it."""
    rows, tensors = [], {}
    for i, prompt in enumerate(prompts.itertuples(index=False)):
        start = time.perf_counter()
        prompt_ids = [int(t) for t in prompt.input_ids]
        continuation = generate_baseline(target, torch.tensor([prompt_ids]), new_tokens).tokens
        ids = prompt_ids + continuation
        logits = target(input_ids=torch.tensor([ids]), use_cache=False,
                        logits_to_keep=len(continuation) + 1).logits[0, :-1].float()
        top = torch.log_softmax(logits, dim=-1).topk(top_k, dim=-1)
        tensors[f"indices_{i}"] = top.indices.to(torch.int32).contiguous()
        tensors[f"logprobs_{i}"] = top.values.contiguous()
        rows.append({"prompt_id": prompt.prompt_id, "input_ids": ids, "n_prompt": len(prompt_ids)})
        log(f"[{i + 1}/{len(prompts)}] {prompt.prompt_id}: {len(continuation)} tokens "
            f"({time.perf_counter() - start:.1f}s)")
    return pd.DataFrame(rows), tensors


def save_teacher_data(sequences: pd.DataFrame, tensors: dict[str, torch.Tensor], directory: Path) -> None:
    directory = Path(directory)
    with atomic_path(directory / "teacher.safetensors") as tmp:
        save_file(tensors, str(tmp))
    with atomic_path(directory / "sequences.parquet") as tmp:
        sequences.to_parquet(tmp, index=False)


def load_teacher_data(directory: Path) -> tuple[pd.DataFrame, dict[str, torch.Tensor]]:
    directory = Path(directory)
    return pd.read_parquet(directory / "sequences.parquet"), load_file(str(directory / "teacher.safetensors"))


# --- training -----------------------------------------------------------------------------------------------------
def distillation_loss(student_logits: torch.Tensor, indices: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(teacher top-k, renormalised || student) for logits (n, V), indices/logprobs (n, k)."""
    teacher = torch.softmax(logprobs, dim=-1)  # renormalised over the top k
    student = torch.log_softmax(student_logits.float(), dim=-1).gather(-1, indices.long())
    return (teacher * (torch.log(teacher.clamp_min(1e-30)) - student)).sum(-1).mean()


def _trainable(student, train_head: bool) -> list[torch.nn.Parameter]:
    for p in student.parameters():
        p.requires_grad_(False)
    modules = [student.model.layers, student.model.norm] + ([student.lm_head] if train_head else [])
    params = [p for m in modules for p in m.parameters()]
    for p in params:
        p.requires_grad_(True)
    return params


def _batch_loss(student, sequences, tensors, picks, max_length) -> torch.Tensor:
    losses = []
    for i in picks:
        row = sequences.iloc[i]
        ids, n_prompt = list(row["input_ids"]), int(row["n_prompt"])
        cut = max(0, len(ids) - max_length)  # keep the continuation, drop the prompt's beginning if too long
        n_cont = len(ids) - n_prompt
        logits = student(input_ids=torch.tensor([ids[cut:]]), use_cache=False,
                         logits_to_keep=n_cont + 1).logits[0, :-1]
        losses.append(distillation_loss(logits, tensors[f"indices_{i}"], tensors[f"logprobs_{i}"]))
    return torch.stack(losses).mean()


def distill(student, sequences: pd.DataFrame, tensors: dict[str, torch.Tensor], settings: DistillSettings,
            checkpoint_dir: Path | None = None, log: Callable[[str], None] = print) -> pd.DataFrame:
    """Train in place; returns the loss curve (step, loss, seconds). With checkpoint_dir, resumes from the last
    checkpoint there and writes one every settings.checkpoint_every steps."""
    params = _trainable(student, settings.train_head)
    optimizer = torch.optim.AdamW(params, lr=settings.learning_rate, weight_decay=settings.weight_decay)
    first, curve, rng = resume_training(student, optimizer, checkpoint_dir, len(sequences), settings.batch_size,
                                        settings.seed, log)
    student.train()
    for step in range(first, settings.steps):
        start = time.perf_counter()
        picks = rng.choice(len(sequences), size=settings.batch_size)
        loss = _batch_loss(student, sequences, tensors, picks, settings.max_length)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        curve.append({"step": step + 1, "loss": loss.item(), "seconds": time.perf_counter() - start})
        log(f"step {step + 1}/{settings.steps}: loss {curve[-1]['loss']:.4f} ({curve[-1]['seconds']:.1f}s)")
        if checkpoint_dir is not None and ((step + 1) % settings.checkpoint_every == 0 or step + 1 == settings.steps):
            save_checkpoint(student, optimizer, Path(checkpoint_dir), step + 1, curve, settings)
    student.eval()
    for p in student.parameters():
        p.requires_grad_(False)
    return pd.DataFrame(curve, columns=["step", "loss", "seconds"])


def resume_training(model, optimizer, checkpoint_dir: Path | None, n_items: int, batch_size: int, seed: int,
                    log: Callable[[str], None] = print) -> tuple[int, list[dict], np.random.Generator]:
    """(the step to start from, the loss curve so far, the batch sampler): from the last checkpoint in
    checkpoint_dir if there is one (weights and optimizer state loaded into model and optimizer), the sampler
    positioned where an uninterrupted run's would be, so a resumed run draws the same batches."""
    curve: list[dict] = []
    first = 0
    if checkpoint_dir is not None and (Path(checkpoint_dir) / "state.json").exists():
        first, curve = load_checkpoint(model, optimizer, Path(checkpoint_dir))
        log(f"resuming from step {first}")
    rng = np.random.default_rng(seed)
    for _ in range(first):
        rng.choice(n_items, size=batch_size)
    return first, curve, rng


def save_checkpoint(student, optimizer, directory: Path, step: int, curve: list[dict], settings) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().contiguous() for k, v in student.state_dict().items()}
    # tied weights share storage; safetensors refuses aliases, so save each distinct tensor once
    seen, unique = set(), {}
    for name, tensor in weights.items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            unique[name] = tensor
    with atomic_path(directory / "student.safetensors") as tmp:
        save_file(unique, str(tmp))
    with atomic_path(directory / "optimizer.pt") as tmp:
        torch.save(optimizer.state_dict(), tmp)
    write_text(json.dumps({"step": step, "curve": curve, "settings": asdict(settings)}) + "\n",
               directory / "state.json")  # last: marks the checkpoint complete


def load_checkpoint(student, optimizer, directory: Path) -> tuple[int, list[dict]]:
    state = json.loads((directory / "state.json").read_text())
    student.load_state_dict(load_file(str(directory / "student.safetensors")), strict=False)
    optimizer.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=True))
    return int(state["step"]), list(state["curve"])
