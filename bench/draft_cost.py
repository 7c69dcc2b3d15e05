"""A model draft's c: its one-token step over the target's, both lean GGUF sessions in one process, their steps
interleaved round by round (so a shared host's drift hits both), after a cached context.

    python bench/draft_cost.py [--target resources/gguf/qwen2.5-coder-1.5b-instruct.gguf]
                               [--draft resources/gguf/qwen2.5-coder-0.5b-instruct.gguf [OTHER.gguf ...]]
                               [--head-vocab 65536 [32768 ...]] [--head-type q5_0] [--rounds 40] [--steps 5]
                               [--out draft_cost.csv]

Each round times `--steps` one-token steps of every session in turn (rotating which goes first) and takes their
median; c is the draft's median over the target's in the same round, reported as the median over rounds with the
10th-90th percentile of the rounds' ratios. Several --draft files are timed in the same rounds (named by their file
names); --head-vocab adds each draft with its head limited to the first N ids, for each N, and --head-type each
draft (and each limited one) with its head rows requantised to that type (LeanLM.requantize_head).
Each session loads with this machine's kernel plan (specdec/gguf/kernel_plan.py), printed first. Run it alone."""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from specdec.gguf.lean import LeanLM
from specdec.study.io import write_csv


def step_seconds(session: LeanLM, context: int, tokens: list[int]) -> float:
    """The median of one-token steps over `tokens`, each after the context (cropped back to it)."""
    times = []
    for token in tokens:
        start = time.perf_counter()
        session.extend([token], 1)
        times.append(time.perf_counter() - start)
        session.crop(context)
    return statistics.median(times)


def cost_table(rounds: list[dict[str, float]], target: str = "target") -> pd.DataFrame:
    """Per draft session: its median step, the target's, and c = the median of the rounds' ratios with the 10th and
    90th percentiles of them."""
    if not rounds:
        raise ValueError("no timed rounds: nothing to report")
    rows = []
    for name in rounds[0]:
        if name == target:
            continue
        ratios = np.array([r[name] / r[target] for r in rounds])
        rows.append({"draft": name, "draft_ms": 1e3 * statistics.median(r[name] for r in rounds),
                     "target_ms": 1e3 * statistics.median(r[target] for r in rounds),
                     "c": float(np.median(ratios)), "c_p10": float(np.percentile(ratios, 10)),
                     "c_p90": float(np.percentile(ratios, 90)), "rounds": len(rounds)})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="resources/gguf/qwen2.5-coder-1.5b-instruct.gguf")
    parser.add_argument("--draft", nargs="+", default=["resources/gguf/qwen2.5-coder-0.5b-instruct.gguf"])
    parser.add_argument("--head-vocab", nargs="+", type=int, default=[])
    parser.add_argument("--head-type", nargs="+", default=[], choices=["q5_0", "q8_0"])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="a CSV of the table (printed either way)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.steps < 1:
        parser.error(f"--rounds and --steps must be at least 1, got {args.rounds} and {args.steps}")
    torch.set_num_threads(args.threads)
    sessions = {"target": LeanLM(args.target)}

    def add(name: str, path: str, session) -> LeanLM:
        """sessions[name] = session, refusing a name already taken (a variant's included: the table keys on it)."""
        if name in sessions:
            parser.error(f"{path}: the name {name!r} is taken (the target's or another draft's): give the drafts "
                         f"files of other names")
        sessions[name] = session
        return session

    for path in args.draft:
        name = "draft" if len(args.draft) == 1 else Path(path).stem
        draft = add(name, path, LeanLM(path))
        if sessions["target"].vocab_size != draft.vocab_size:
            parser.error(f"the draft {path}'s vocabulary ({draft.vocab_size}) differs from the target's "
                         f"({sessions['target'].vocab_size})")
        for vocab, head_type in itertools.product([None, *args.head_vocab], [None, *args.head_type]):
            if vocab is None and head_type is None:
                continue
            suffix = (f"-v{vocab}" if vocab else "") + (f"-{head_type}" if head_type else "")
            variant = add(name + suffix, path, LeanLM(draft.model))
            if vocab:
                variant.limit_head_vocab(vocab)
            if head_type:
                variant.requantize_head(head_type.upper())
    for name, session in sessions.items():
        plan = session.model.plan
        print(f"{name}: {Path(session.model.path).name}, kernel plan {plan.label() if plan else 'none'}", flush=True)
    generator = torch.Generator().manual_seed(0)
    vocab = min([*args.head_vocab, sessions["target"].vocab_size])
    context = torch.randint(0, vocab, (args.context,), generator=generator).tolist()
    for session in sessions.values():
        session.extend(context, 1)
    names = list(sessions)
    rounds = []
    for index in range(args.rounds + 1):  # the first round warms up
        tokens = torch.randint(0, vocab, (args.steps,), generator=generator).tolist()
        order = names[index % len(names):] + names[:index % len(names)]
        timed = {name: step_seconds(sessions[name], args.context, tokens) for name in order}
        if index:
            rounds.append(timed)
    table = cost_table(rounds)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.out:
        write_csv(table, args.out)


if __name__ == "__main__":
    main()
