"""Training a feature-level draft head (specdec/drafts/feature_head.py) on the target's own answers.

Data (`head_data`): training prompts, disjoint from the evaluation prompts, each followed by the target's own greedy
continuation (self-distillation), and the target's features at every position, kept while generating them (the
forward computes them anyway; fp16 on disk). Made in parts so that an interrupted run resumes. The drafting
vocabulary is the data's most frequent tokens.

Loss per position t >= 1 (the head reads [feature(t-1), token t]): a smooth-L1 feature loss between the target's
norm of the head's output and feature(t), plus `token_weight` x the cross-entropy of the head's logits against the
target's own distribution at t, both over the drafting vocabulary (the target's logits are its features times the
same LM head rows: only the columns the head can draft). The head's inputs are the true features, with Gaussian
noise of std `noise` x their RMS (drafting feeds the head its own, slightly wrong, predictions).
Checkpoints (distill.save_checkpoint) let an interrupted run resume with the same batches.

A head may also fuse some of the target's layers (`fused_layers`, EAGLE-3's low, middle and high features): its data
rows then hold those layers' outputs beside the final hidden state (`head_data(..., layers=...)`, each scaled to an
RMS of 1), the head folds them in where it reads a target row (FeatureHead.fold), and its own predictions stand in
for them while drafting, as before.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd
import torch
import torch.nn.functional as F

from safetensors.torch import load_file, save_file

from specdec.native.attention import INVARIANT_ROWS
from specdec.decode import generate_baseline
from specdec.drafts.feature_head import WEIGHTS_FILE, FeatureHead, HeadConfig, TargetParts, untrained_head
from specdec.errors import DraftSpecError
from specdec.features import checked_layers
from specdec.study.training.distill import resume_training, save_checkpoint
from specdec.study.io import atomic_directory, atomic_path, write_text

FEATURES_FILE = "features.safetensors"
SEQUENCES_FILE = "sequences.parquet"
STEP_ROWS = INVARIANT_ROWS  # rows a stepped read passes at once: the engine's batch-invariant path
LAYERS_FILE = "feature_layers.json"  # the target layers whose outputs the data's feature rows hold (absent: none)


# The learning rate's factor after warm-up, by step (0-based), warm-up steps and all steps.
SCHEDULES = {
    "constant": lambda step, warmup, steps: 1.0,
    "cosine": lambda step, warmup, steps: 0.5 * (1 + math.cos(math.pi * min(1.0, max(0, step + 1 - warmup)
                                                                                / max(1, steps - warmup)))),
}


@dataclass(frozen=True)
class FeatureHeadSettings:
    steps: int = 2000
    batch_size: int = 4  # sequences per step
    max_length: int = 256  # positions per sequence (its last ones)
    learning_rate: float = 3e-4
    warmup: int = 50  # steps of linear warm-up
    token_weight: float = 0.1
    noise: float = 0.02
    vocab: int | None = 32768  # drafting vocabulary (None: every token)
    checkpoint_every: int = 100
    seed: int = 0
    schedule: str = "constant"  # the learning rate after warm-up: constant, or cosine (down to 0 at the last step)
    data: tuple[str, ...] = ("answers",)  # the workflow's data sets (answers, corpus: feature_head.smk)
    init: str | None = None  # another head whose trained weights (and drafting vocabulary) training starts from
    unroll: int = 1  # depths trained: 1 teacher forcing only; d > 1 also drafts d - 1 steps on its own predictions
    unroll_decay: float = 0.8  # depth d's loss weighs decay**d (EAGLE-3's training script: 0.8)
    # target layers whose outputs the head fuses beside the final hidden state (its data must hold them: the
    # workflow's *_layers data sets); a head started from one that fuses none gets a zero-initialised fusion
    fused_layers: tuple[int, ...] = ()

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise DraftSpecError(f"training schedule {self.schedule!r}: one of {list(SCHEDULES)}")
        if not isinstance(self.unroll, int) or isinstance(self.unroll, bool) or self.unroll < 1:
            raise DraftSpecError(f"training unroll {self.unroll!r}: a whole number of depths, at least 1")
        if not 0 < self.unroll_decay <= 1:
            raise DraftSpecError(f"training unroll_decay {self.unroll_decay!r}: a weight in (0, 1]")
        object.__setattr__(self, "data", tuple(self.data))
        try:  # the sessions' own check, without their number of layers (the data and the target check that)
            object.__setattr__(self, "fused_layers", checked_layers(self.fused_layers, None))
        except ValueError:
            raise DraftSpecError(f"training fused_layers {list(self.fused_layers)!r}: increasing distinct decoder "
                                 "layers (0-based)") from None

    def learning_rate_at(self, step: int) -> float:
        """The learning rate of step `step` (0-based): linear warm-up, then the schedule."""
        warm = min(1.0, (step + 1) / max(1, self.warmup))
        return self.learning_rate * warm * SCHEDULES[self.schedule](step, self.warmup, self.steps)


def settings_from_config(values: dict, key: str) -> FeatureHeadSettings:
    """The settings a draft's `training` (and `vocab`) fields give; an unknown one is named with its config key."""
    known = {f.name for f in fields(FeatureHeadSettings)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise DraftSpecError(f"config key '{key}.training': unknown setting(s) {unknown} (known: {sorted(known)})")
    return FeatureHeadSettings(**values)


@torch.inference_mode()
def target_features(model, sequences: Sequence[Sequence[int]], log: Callable[[str], None] = print
                    ) -> dict[str, torch.Tensor]:
    """features_{i}: (len(sequence i), hidden) fp16, the target's final hidden states after its final norm."""
    decoder = model.get_decoder()
    out = {}
    for i, ids in enumerate(sequences):
        start = time.perf_counter()
        hidden = decoder(input_ids=torch.tensor([list(ids)]), use_cache=False).last_hidden_state[0]
        out[f"features_{i}"] = hidden.to(torch.float16).contiguous()
        log(f"[{i + 1}/{len(sequences)}] features of {len(ids)} positions ({time.perf_counter() - start:.1f}s)")
    return out


def stored_rows(rows: torch.Tensor, hidden: int) -> torch.Tensor:
    """Feature rows as the data keep them, fp16: the final hidden state as it is, each fused layer's output scaled to
    an RMS of 1 (a head RMS-norms them anyway; a layer's outliers could overflow fp16 unscaled)."""
    parts = rows.float().unflatten(-1, (-1, hidden))
    layers = parts[:, 1:]
    layers = layers * torch.rsqrt(layers.pow(2).mean(-1, keepdim=True) + 1e-12)
    return torch.cat([parts[:, :1], layers], dim=1).flatten(1).to(torch.float16).contiguous()


def layer_columns(rows: torch.Tensor, kept: Sequence[int], wanted: Sequence[int], hidden: int) -> torch.Tensor:
    """Of feature rows holding the final hidden state and the outputs of layers `kept`, those of `wanted` (a subset)
    beside the final hidden state: what a head that fuses `wanted` reads."""
    missing = sorted(set(wanted) - set(kept))
    if missing:
        raise ValueError(f"a head fuses layers {list(wanted)}; the rows hold {list(kept)} beside the final hidden "
                         "state")
    parts = rows.unflatten(-1, (1 + len(kept), hidden))
    return parts[..., [0] + [1 + list(kept).index(i) for i in wanted], :].flatten(-2)


def load_features(directory: Path, n_sequences: int) -> list[torch.Tensor]:
    """The features of sequences 0..n-1; an error naming the directory when they were made for other sequences."""
    tensors = load_file(str(Path(directory) / FEATURES_FILE))
    if len(tensors) != n_sequences:
        raise ValueError(f"{directory} holds features of {len(tensors)} sequences, the training data has "
                         f"{n_sequences}: delete it to compute them again")
    return [tensors[f"features_{i}"] for i in range(n_sequences)]


def self_distilled(session, prompt_ids: Sequence[int], new_tokens: int, layers: Sequence[int] = (),
                   stepped_from: int | None = None) -> tuple[list[int], torch.Tensor]:
    """The prompt followed by the session's greedy continuation (up to new_tokens; its last token dropped, since no
    forward computed its feature), and the features of those positions, (n, hidden x (1 + len(layers))) fp16
    (stored_rows), as the session kept them while generating (a session with keep_hidden_states: lm.CachedLM,
    lean.LeanLM), with the outputs of `layers` beside them. new_tokens 0: the text as given, read in one forward
    (head_corpus: text the target reads rather than writes); with stepped_from, its first stepped_from tokens in one
    forward and the rest in passes of STEP_ROWS, as decoding's steps compute them (an answer read again: on a
    batch-invariant engine, the bits its generation computed)."""
    session.keep_hidden_states(layers)
    if new_tokens == 0:
        ids = [int(t) for t in prompt_ids]
        session.reset()
        first = len(ids) if stepped_from is None else max(1, min(int(stepped_from), len(ids)))
        session.extend(ids[:first], 1)
        for start in range(first, len(ids), STEP_ROWS):
            session.extend(ids[start:start + STEP_ROWS], 1)
    else:
        continuation = generate_baseline(session, torch.tensor([list(prompt_ids)]), new_tokens).tokens
        ids = [int(t) for t in prompt_ids] + continuation[:-1]
    rows = session.hidden_states(0, len(ids))
    return ids, stored_rows(rows, rows.shape[1] // (1 + len(layers)))


def head_data(session, prompts: pd.DataFrame, new_tokens: int, out_dir: Path, parts_dir: Path, key: dict,
              part_size: int = 16, log: Callable[[str], None] = print, layers: Sequence[int] = (),
              stepped: bool = False) -> None:
    """The heads' training data -> out_dir (sequences.parquet: prompt_id, input_ids, n_prompt; features.safetensors:
    features_{i} of row i, with the outputs of `layers` beside the final hidden state (feature_layers.json names
    them)), written at the end, atomically. Made part by part (part_size prompts) in parts_dir, which a rerun after
    an interruption continues from; parts made under another `key` (prompts, length, model, layers) are discarded
    first. parts_dir is deleted once out_dir is complete. stepped (new_tokens 0, prompts with n_prompt: answers read
    again): each text past its n_prompt tokens read as decoding steps compute it (self_distilled's stepped_from)."""
    parts_dir = Path(parts_dir)
    key = {**key, "prompt_ids": [str(p) for p in prompts["prompt_id"]], "new_tokens": int(new_tokens),
           "part_size": int(part_size), "feature_layers": [int(i) for i in layers], "stepped": bool(stepped)}
    key_file = parts_dir / "key.json"
    if parts_dir.exists() and (not key_file.exists() or json.loads(key_file.read_text()) != key):
        log(f"{parts_dir}: parts made for other prompts or settings, starting over")
        shutil.rmtree(parts_dir)
    parts_dir.mkdir(parents=True, exist_ok=True)
    write_text(json.dumps(key) + "\n", key_file)
    n_parts = -(-len(prompts) // part_size)
    begin = time.perf_counter()
    for j in range(n_parts):
        part = parts_dir / f"part_{j:04d}.safetensors"
        if part.exists():
            continue
        rows, tensors = prompts.iloc[j * part_size:(j + 1) * part_size], {}
        for i, prompt in enumerate(rows.itertuples(index=False)):
            start = time.perf_counter()
            ids, features = self_distilled(session, prompt.input_ids, new_tokens, layers,
                                           prompt.n_prompt if stepped else None)
            tensors[f"features_{i}"] = features
            tensors[f"ids_{i}"] = torch.tensor(ids, dtype=torch.int32)
            made = (f"{len(ids) - len(prompt.input_ids) + 1} tokens after {len(prompt.input_ids)}" if new_tokens
                    else f"{len(ids)} positions read")
            log(f"[{j * part_size + i + 1}/{len(prompts)}] {prompt.prompt_id}: {made} "
                f"({time.perf_counter() - start:.1f}s; {(time.perf_counter() - begin) / 60:.1f} min this run)")
        with atomic_path(part) as tmp:
            save_file(tensors, str(tmp))
    sequences, features = [], {}
    for j in range(n_parts):
        tensors = load_file(str(parts_dir / f"part_{j:04d}.safetensors"))
        for i, prompt in enumerate(prompts.iloc[j * part_size:(j + 1) * part_size].itertuples(index=False)):
            features[f"features_{len(sequences)}"] = tensors[f"features_{i}"]
            sequences.append({"prompt_id": prompt.prompt_id, "input_ids": tensors[f"ids_{i}"].tolist(),
                              "n_prompt": getattr(prompt, "n_prompt", len(prompt.input_ids))})
    with atomic_directory(out_dir) as tmp:
        pd.DataFrame(sequences).to_parquet(tmp / SEQUENCES_FILE, index=False)
        save_file(features, str(tmp / FEATURES_FILE))
        if layers:
            (tmp / LAYERS_FILE).write_text(json.dumps([int(i) for i in layers]) + "\n")
    shutil.rmtree(parts_dir)


def data_layers(directory: Path) -> tuple[int, ...]:
    """The target layers whose outputs a head_data directory's feature rows hold beside the final hidden state."""
    path = Path(directory) / LAYERS_FILE
    return tuple(json.loads(path.read_text())) if path.is_file() else ()


def load_head_data(*directories: Path, layers: Sequence[int] = ()) -> tuple[list[list[int]], list[torch.Tensor]]:
    """(token ids, features) of every training sequence in one or more head_data directories, in their order: the
    final hidden states and the outputs of `layers` (a head's fused_layers), which each directory's rows must hold
    (the error names the one that does not); other layers' columns are dropped."""
    ids, features = [], []
    for directory in directories:
        held = data_layers(directory)
        if not set(layers) <= set(held):
            raise ValueError(f"{directory} holds the outputs of target layers {list(held)} beside its features; the "
                             f"head fuses {list(layers)}: train it on data made with those layers")
        sequences = pd.read_parquet(Path(directory) / SEQUENCES_FILE)
        these = [list(map(int, row)) for row in sequences["input_ids"]]
        ids += these
        rows = load_features(directory, len(these))
        if tuple(layers) != held:
            hidden = rows[0].shape[1] // (1 + len(held)) if rows else 0
            rows = [layer_columns(r, held, layers, hidden).contiguous() for r in rows]
        features += rows
    return ids, features


def drafting_vocabulary(sequences: Sequence[Sequence[int]], size: int | None, vocab_size: int) -> list[int]:
    """The `size` most frequent tokens of the sequences (ties: the lower id), then the lowest unseen ids if the data
    holds fewer distinct tokens; every token when size is None or covers the vocabulary."""
    if size is None or size >= vocab_size:
        return list(range(vocab_size))
    counts = Counter(int(t) for ids in sequences for t in ids)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    unseen = (t for t in range(vocab_size) if t not in counts)
    return sorted(ranked + [next(unseen) for _ in range(size - len(ranked))])


def unrolled_mask(rows: int, depth: int) -> torch.Tensor:
    """(rows, (depth + 1) x rows) booleans: the keys a query `depth` steps into a drafting block sees, over the keys
    of depths 0..depth side by side (rows each). Row r at depth d is the block's d-th drafted position, the block
    started at row r - d with a target feature: it sees depth 0's keys up to r - d (positions fed true features) and,
    of each depth j = 1..d, only row r - d + j (the block's own drafted positions). Depth 0: causal."""
    row, key = torch.arange(rows)[:, None], torch.arange(rows)[None, :]
    return torch.cat([key <= row - depth] + [key == row - depth + j for j in range(1, depth + 1)], dim=1)


def unrolled_predictions(head: FeatureHead, parts, inputs: torch.Tensor, embeddings: torch.Tensor,
                         positions: torch.Tensor, depths: int) -> list[torch.Tensor]:
    """The head's predicted features (after the target's norm), (rows, hidden) for each depth 0..depths-1, of one
    sequence: depth 0 reads `inputs` (the target's feature rows of the previous positions); depth d reads depth
    d-1's prediction of the previous row (row 0 keeps its input) and attends as drafting does d steps into a block
    (unrolled_mask). Rows r < d of depth d have no such block and are not meant to be scored."""
    predictions, keys, values = [], [], []
    inputs = head.fold(inputs)  # the target's feature rows to the head's width (a prediction's)
    for depth in range(depths):
        if depth:
            inputs = torch.cat([inputs[:1], predictions[-1][:-1]])
        hidden, q, k, v = head.attention_inputs(inputs[None], embeddings[None], positions)
        keys.append(k)
        values.append(v)
        out = head.after_attention(hidden, q, torch.cat(keys, dim=2), torch.cat(values, dim=2),
                                   unrolled_mask(len(positions), depth))
        predictions.append(parts.norm(out[0]))
    return predictions


def head_losses(head: FeatureHead, parts: TargetParts, features: torch.Tensor, ids: torch.Tensor,
                noise: float = 0.0, generator: torch.Generator | None = None, rows: torch.Tensor | None = None,
                depths: int = 1, decay: float = 0.8) -> tuple[torch.Tensor, torch.Tensor]:
    """(feature loss, token loss) of one sequence: features (n, feature_width: the final hidden state and any fused
    layers' outputs), ids (n,). Depth 0 (teacher forcing): the means over positions 1..n-1. With depths > 1
    (training-time drafting, as EAGLE-3's "training-time test"): the head also drafts d = 1..depths-1 steps on its
    own predicted features (unrolled_predictions), each depth scored on the positions it predicts, the depths' losses
    averaged with weights decay**d.
    rows: the LM head's rows of the head's drafting vocabulary (parts.head_rows; a training loop gathers them once)."""
    if rows is None:
        rows = parts.head_rows(head.draft_vocab)
    dtype = head.fc.weight.dtype
    features = features.to(dtype)
    inputs = features[:-1]
    if noise:  # each part of a row (final hidden state, fused layers' outputs) with noise of its own RMS's scale
        parts_of_rows = inputs.unflatten(-1, (-1, head.config.hidden_size))
        scale = parts_of_rows.pow(2).mean(-1, keepdim=True).sqrt() * noise
        noisy = parts_of_rows + scale * torch.randn(parts_of_rows.shape, generator=generator, dtype=dtype)
        inputs = noisy.flatten(-2)
    features = features[:, :head.config.hidden_size]  # what the head predicts: the final hidden states
    positions = torch.arange(1, len(ids))
    with torch.no_grad():
        embeddings = parts.embed(ids[1:]).to(dtype)
        target_probs = torch.softmax(F.linear(features[1:], rows).float(), dim=-1)
    feature_losses, token_losses, weights = [], [], []
    for depth, predicted in enumerate(unrolled_predictions(head, parts, inputs, embeddings, positions, depths)):
        if depth >= len(predicted):
            break
        predicted = predicted[depth:]
        feature_losses.append(F.smooth_l1_loss(predicted, features[1 + depth:]))
        token_losses.append(-(target_probs[depth:] * torch.log_softmax(F.linear(predicted, rows).float(), -1))
                            .sum(-1).mean())
        weights.append(decay ** depth)
    weights = torch.tensor(weights) / sum(weights)
    return (torch.stack(feature_losses) * weights.to(feature_losses[0].dtype)).sum(), \
        (torch.stack(token_losses) * weights).sum()


@torch.no_grad()
def greedy_blocks(head: FeatureHead, parts, features: torch.Tensor, ids: torch.Tensor, k: int,
                  rows: torch.Tensor | None = None) -> torch.Tensor:
    """Greedy drafting of k tokens from every position of one sequence, offline: (len(ids) - k - 1, k) booleans,
    row s true at j where the head's j-th draft of the block after position s + 1 (context ids[:s + 2]) is
    ids[s + 2 + j] (unrolled_predictions: the head drafting on its own features, fed the sequence's tokens). Where
    the sequence is the target's greedy text, a block accepts its leading trues, as greedy decoding would.
    features: the target's at every position; parts: its embeddings and norm and LM head rows (either engine's);
    rows: the LM head's rows of the head's drafting vocabulary (parts.head_rows; a caller of many sequences gathers
    them once)."""
    if rows is None:
        rows = parts.head_rows(head.draft_vocab)
    rows = rows.to(head.fc.weight.dtype)
    features = features.to(head.fc.weight.dtype)
    depths = unrolled_predictions(head, parts, features[:-1], parts.embed(ids[1:]).to(features.dtype),
                                  torch.arange(1, len(ids)), k)
    blocks = len(ids) - k - 1
    drafted = [head.draft_vocab[F.linear(depths[j][j:j + blocks], rows).argmax(-1)] for j in range(k)]
    return torch.stack([drafted[j] == ids[2 + j:2 + j + blocks] for j in range(k)], dim=1)


def train_feature_head(head: FeatureHead, parts: TargetParts, features: Sequence[torch.Tensor],
                       sequences: Sequence[Sequence[int]], settings: FeatureHeadSettings,
                       checkpoint_dir: Path | None = None, log: Callable[[str], None] = print) -> pd.DataFrame:
    """Train the head in place (the target's parts stay frozen); returns the curve (step, loss, feature_loss,
    token_loss, seconds). With checkpoint_dir: resumes from its last checkpoint, writes one every checkpoint_every
    steps."""
    if len(features) != len(sequences) or not sequences:
        raise ValueError(f"{len(features)} feature tensors for {len(sequences)} sequences")
    for p in [*parts.embed.parameters(), *parts.norm.parameters(), *parts.lm_head.parameters()]:
        p.requires_grad_(False)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.learning_rate)
    first, curve, rng = resume_training(head, optimizer, checkpoint_dir, len(sequences), settings.batch_size,
                                        settings.seed, log)
    rows = parts.head_rows(head.draft_vocab).to(head.fc.weight.dtype)  # gathered once, not per sequence and step
    head.train()
    for step in range(first, settings.steps):
        start = time.perf_counter()
        noise = torch.Generator().manual_seed(settings.seed * 1_000_003 + step)
        losses = []
        for i in rng.choice(len(sequences), size=settings.batch_size):
            ids = torch.as_tensor(list(sequences[i]))[-settings.max_length:]
            losses.append(head_losses(head, parts, features[i][-settings.max_length:], ids, settings.noise, noise,
                                      rows, settings.unroll, settings.unroll_decay))
        feature_loss = torch.stack([f for f, _ in losses]).mean()
        token_loss = torch.stack([t for _, t in losses]).mean()
        loss = feature_loss + settings.token_weight * token_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        for group in optimizer.param_groups:
            group["lr"] = settings.learning_rate_at(step)
        optimizer.step()
        curve.append({"step": step + 1, "loss": loss.item(), "feature_loss": feature_loss.item(),
                      "token_loss": token_loss.item(), "seconds": time.perf_counter() - start})
        log(f"step {step + 1}/{settings.steps}: loss {loss.item():.4f} (feature {feature_loss.item():.4f}, token "
            f"{token_loss.item():.3f}; {curve[-1]['seconds']:.2f}s)")
        if checkpoint_dir is not None and ((step + 1) % settings.checkpoint_every == 0 or step + 1 == settings.steps):
            save_checkpoint(head, optimizer, Path(checkpoint_dir), step + 1, curve, settings)
    head.eval()
    return pd.DataFrame(curve, columns=["step", "loss", "feature_loss", "token_loss", "seconds"])


def train_head_for(target, sequences: Sequence[Sequence[int]], features: Sequence[torch.Tensor],
                   settings: FeatureHeadSettings, checkpoint_dir: Path | None = None,
                   log: Callable[[str], None] = print, init: FeatureHead | None = None
                   ) -> tuple[FeatureHead, pd.DataFrame]:
    """A head for a Hugging Face target, trained: (head, curve). It starts new (its drafting vocabulary from the
    sequences) or from `init`, a trained head of the same target (its vocabulary kept; settings.vocab unused)."""
    if init is None:
        vocab = drafting_vocabulary(sequences, settings.vocab, int(target.config.vocab_size))
        head = untrained_head(target, vocab, seed=settings.seed, fused_layers=settings.fused_layers)
    else:
        made_for = replace(init.config, fused_layers=())
        if asdict(made_for) != asdict(HeadConfig.of_target(target.config)):
            raise DraftSpecError(f"the head to start from was made for another target: {made_for} against "
                                 f"{HeadConfig.of_target(target.config)}")
        head = with_fused_layers(init, settings.fused_layers).to(next(target.parameters()).dtype)
    curve = train_feature_head(head, TargetParts(target), features, sequences, settings, checkpoint_dir, log)
    return head, curve


def with_fused_layers(head: FeatureHead, layers: Sequence[int]) -> FeatureHead:
    """`head` itself where it fuses `layers` already; a head that fuses none widened to fuse them (its weights kept,
    the fusion zero-initialised: it drafts as `head` did until trained); else a clear error."""
    layers = tuple(layers)
    if head.config.fused_layers == layers:
        return head
    if head.config.fused_layers:
        raise DraftSpecError(f"the head to start from fuses target layers {list(head.config.fused_layers)}; this "
                             f"training fuses {list(layers)}")
    wide = FeatureHead(replace(head.config, fused_layers=layers), head.draft_vocab.tolist())
    missing, unexpected = wide.load_state_dict(head.state_dict(), strict=False)
    if unexpected or any(not name.startswith(("fuse.", "layer_norms.")) for name in missing):
        raise RuntimeError(f"widening a head: unexpected {unexpected}, missing {missing}")
    return wide.to(head.fc.weight.dtype).train(head.training)


def save_trained_head(head: FeatureHead, directory: Path, name: str, record: dict) -> None:
    """The head's files (FeatureHead.save, with `record`) and a manifest.json like a prepared model's: what
    provenance records of every model a study decodes with."""
    head.save(directory, **record)
    digest = hashlib.sha256((Path(directory) / WEIGHTS_FILE).read_bytes()).hexdigest()
    manifest = {"name": name, "source": {"source": "feature_head", **record}, "num_hidden_layers": 1,
                "hidden_size": head.config.hidden_size, "vocab_size": head.config.vocab_size,
                "drafting_vocabulary": len(head.draft_vocab),
                "parameter_count": sum(p.numel() for p in head.parameters()),
                "safetensors_sha256": {WEIGHTS_FILE: digest},
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    write_text(json.dumps(manifest, indent=2) + "\n", Path(directory) / "manifest.json")
