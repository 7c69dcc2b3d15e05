"""Is the quantized engine the same model? Next-token agreement between the GGUF engine (specdec.gguf.lean, 8-bit
activations per block) and the fp32 engine on the same GGUF file's dequantised weights (issue 25, item 4).

    python bench/same_model.py --out results/study-gguf/tables/same_model.csv [--prompts 5] [--tokens 32]

Per prompt of each domain: the fp32 engine's greedy continuation; then both engines score prompt + continuation in
one pass (teacher forcing) and, at every continuation position, we compare the next-token distributions: top-1
agreement and KL(fp32 || gguf) in nats. Not a timing: it may share the machine."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

from specdec.gguf.lean import LeanLM
from specdec.lm import CachedLM
from specdec.fp32.loading import load_for_decoding
from specdec.runtime import Runtime
from specdec.study.io import write_csv


def continuation(session, prompt: list[int], tokens: int) -> list[int]:
    session.reset()
    logits, out = session.extend(prompt, 1)[0], []
    for _ in range(tokens):
        out.append(int(logits.argmax()))
        logits = session.extend([out[-1]], 1)[0]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--domains", nargs="+", default=["code", "factual", "prose", "dialogue"])
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--prompts-dir", default="results/study-gguf/prompts", help="where {domain}.parquet lie")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="results/study-gguf/tables/same_model.csv")
    args = parser.parse_args()
    fp32, _ = load_for_decoding(f"resources/models/{args.model}", Runtime(threads=args.threads))
    reference, quantized = CachedLM(fp32), LeanLM(f"resources/gguf/{args.model}.gguf")
    rows = []
    for domain in args.domains:
        prompts = pd.read_parquet(f"{args.prompts_dir}/{domain}.parquet").head(args.prompts)
        for prompt_id, ids in zip(prompts["prompt_id"], prompts["input_ids"]):
            prompt = [int(t) for t in ids]
            tokens = prompt + continuation(reference, prompt, args.tokens)
            scored = []
            for session in (reference, quantized):
                session.reset()
                scored.append(session.extend(tokens, args.tokens).double().log_softmax(-1))
            p, q = scored
            kl = (p.exp() * (p - q)).sum(-1)
            rows.append({"model": args.model, "domain": domain, "prompt_id": prompt_id, "positions": args.tokens,
                         "top1_agree": int((p.argmax(-1) == q.argmax(-1)).sum()), "mean_kl": float(kl.mean()),
                         "max_kl": float(kl.max())})
            print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_csv(table, args.out)
    summary = table.groupby("domain").agg(prompts=("prompt_id", "count"), positions=("positions", "sum"),
                                          top1_agree=("top1_agree", "sum"), mean_kl=("mean_kl", "mean"))
    summary["top1_share"] = summary["top1_agree"] / summary["positions"]
    print(summary.to_string())


if __name__ == "__main__":
    main()
