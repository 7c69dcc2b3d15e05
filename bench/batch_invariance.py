"""Count, on the real models, the positions whose logits are the same bits in a one-token step and in passes of m
positions (issue 26: the batch-invariant default), for each runtime.linear_kernel asked for.

    python bench/batch_invariance.py --model resources/models/qwen2.5-coder-1.5b-instruct \
        --kernels invariant auto --prompts 3 --tokens 32 --out results/tables/batch_invariance.csv

Per prompt of each domain (results/prompts/{domain}.parquet): the prompt pass, then `--tokens` greedy one-token
steps (the reference rows); then, for each m, the same tokens fed in passes of m after the same prompt pass, every
row compared with the step's. Not a timing: it may share the machine."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

from specdec.lm import CachedLM
from specdec.loading import Runtime, load_for_decoding
from specdec.study.io import write_csv


def compare(session, prompt: list[int], tokens: int, ms: list[int]) -> list[dict]:
    session.reset()
    logits = session.extend(prompt, 1)[0]
    generated, steps = [], []
    for _ in range(tokens):
        token = int(logits.argmax())
        generated.append(token)
        logits = session.extend([token], 1)[0]
        steps.append(logits)
    steps = torch.stack(steps)  # row t: the logits after generated[: t + 1]
    rows = []
    for m in ms:
        session.reset()
        session.extend(prompt, 1)
        passes = torch.cat([session.extend(generated[at:at + m], len(generated[at:at + m]))
                            for at in range(0, tokens, m)])
        same = [torch.equal(passes[t], steps[t]) for t in range(tokens)]
        rows.append({"m": m, "positions": tokens, "identical": sum(same),
                     "max_abs_diff": float((passes - steps).abs().max()),
                     "argmax_flips": int((passes.argmax(-1) != steps.argmax(-1)).sum())})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resources/models/qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--kernels", nargs="+", default=["invariant", "auto"])
    parser.add_argument("--domains", nargs="+", default=["code", "factual", "prose", "dialogue"])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--m", nargs="+", type=int, default=[2, 3, 5, 9, 16])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="results/tables/batch_invariance.csv")
    args = parser.parse_args()
    records = []
    for kernel in args.kernels:
        model, _ = load_for_decoding(args.model, Runtime(linear_kernel=kernel, threads=args.threads))
        session = CachedLM(model)
        for domain in args.domains:
            prompts = pd.read_parquet(f"results/prompts/{domain}.parquet").head(args.prompts)
            for prompt_id, ids in zip(prompts["prompt_id"], prompts["input_ids"]):
                start = time.time()
                for row in compare(session, [int(t) for t in ids], args.tokens, args.m):
                    records.append({"model": Path(args.model).name, "linear_kernel": kernel, "domain": domain,
                                    "prompt_id": prompt_id, **row})
                print(f"{kernel} {domain} {prompt_id}: {time.time() - start:.0f} s", flush=True)
        del model, session
    table = pd.DataFrame(records)
    write_csv(table, args.out)
    summary = table.groupby(["linear_kernel", "m"])[["positions", "identical", "argmax_flips"]].sum()
    print(summary.to_string())


if __name__ == "__main__":
    main()
