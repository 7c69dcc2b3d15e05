"""Count, on the real models, the positions whose logits are the same bits in a one-token step and in passes of m
positions (issue 26: the batch-invariant default), for each runtime.linear_kernel asked for.

    python bench/batch_invariance.py --model resources/models/qwen2.5-coder-1.5b-instruct \
        --kernels invariant auto --prompts 3 --tokens 32 --out results/study/tables/batch_invariance.csv
    python bench/batch_invariance.py --gguf resources/gguf/qwen2.5-coder-1.5b-instruct.gguf \
        --prompts-dir results/study-gguf/prompts --out results/study-gguf/tables/batch_invariance.csv

With --gguf the file runs on the lean engine once per quantized product kernel this CPU has (--kernels names them;
default: all) on the file's row layout, and once more in the layout models load with where that is another (Q4_K
and Q6_K in groups of 16 rows on AVX-512: "avx512-vnni-r16"); each run's one-token steps are also compared with the
first kernel's (`identical_to_first_kernel`: the kernels and layouts claim the same bits).

Per prompt of each domain (results/study/prompts/{domain}.parquet): the prompt pass, then `--tokens` greedy one-token
steps (the reference rows); then, for each m, the same tokens fed in passes of m after the same prompt pass, every
row compared with the step's. Not a timing: it may share the machine."""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

import pandas as pd
import torch

from specdec.lm import CachedLM
from specdec.fp32.loading import load_for_decoding
from specdec.runtime import Runtime
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
    return rows, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resources/models/qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--gguf", default=None, help="a GGUF file: run it on the lean engine, per product kernel")
    parser.add_argument("--kernels", nargs="+", default=None,
                        help="linear kernels (default invariant auto), or with --gguf product kernels (default all)")
    parser.add_argument("--domains", nargs="+", default=["code", "factual", "prose", "dialogue"])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--prompts-dir", default="results/study/prompts")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--m", nargs="+", type=int, default=[2, 3, 5, 9, 16])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="results/study/tables/batch_invariance.csv")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.gguf:
        from specdec.gguf import quant
        from specdec.gguf.lean import LeanLM

        kernels, model_name = args.kernels or list(quant.kernels()), Path(args.gguf).name
        os.environ[quant.LAYOUT_ENV] = "rows"
        lean = LeanLM(args.gguf)  # one session: the kernel is chosen per block of work, not per load
        os.environ[quant.LAYOUT_ENV] = "auto"
        sessions = {kernel: (lean, kernel) for kernel in kernels}
        if quant.kernel_label() != quant.kernel_name():  # models load in another layout: that too, on its kernel
            sessions[quant.kernel_label()] = (LeanLM(args.gguf), quant.kernel_name())
        kernels = list(sessions)
    else:
        kernels, model_name = args.kernels or ["invariant", "auto"], Path(args.model).name
    records, first_steps = [], {}
    for kernel in kernels:
        if args.gguf:
            session, context = sessions[kernel][0], quant.use_kernel(sessions[kernel][1])
        else:
            runtime = Runtime(linear_kernel=kernel, threads=args.threads)
            session, context = CachedLM(load_for_decoding(args.model, runtime)[0]), contextlib.nullcontext()
        with context:
            for domain in args.domains:
                prompts = pd.read_parquet(f"{args.prompts_dir}/{domain}.parquet").head(args.prompts)
                for prompt_id, ids in zip(prompts["prompt_id"], prompts["input_ids"]):
                    start = time.time()
                    rows, steps = compare(session, [int(t) for t in ids], args.tokens, args.m)
                    first = first_steps.setdefault(prompt_id, steps)
                    same_as_first = sum(torch.equal(a, b) for a, b in zip(steps, first))
                    for row in rows:
                        records.append({"model": model_name, "linear_kernel": kernel, "domain": domain,
                                        "prompt_id": prompt_id, **row,
                                        "identical_to_first_kernel": same_as_first})
                    print(f"{kernel} {domain} {prompt_id}: {time.time() - start:.0f} s", flush=True)
        del session
    sessions = None
    table = pd.DataFrame(records)
    write_csv(table, args.out)
    summary = table.groupby(["linear_kernel", "m"])[["positions", "identical", "argmax_flips",
                                                      "identical_to_first_kernel"]].sum()
    print(summary.to_string())


if __name__ == "__main__":
    main()
