"""Where a trained feature head stands: its acceptance per drafted position on prompts it was trained on and on
evaluation prompts, greedy, k = 3, on the GGUF engine (the same model as the fp32 one; faster). From each block:
the first token's acceptance, and the second's (third's) given the ones before were accepted. A head that fits its
training prompts but not the evaluation's is short of data; one that misses the second token where it gets the
first cannot draft on its own predicted features.

    python bench/feature_head_fit.py [--head resources/models/coder-head] [--prompts 5] [--tokens 32]

Not a timing: it may share the machine."""

from __future__ import annotations

import argparse

import pandas as pd
import torch

from specdec.decode import generate_speculative
from specdec.drafts.feature_head import FeatureHead, FeatureHeadDraft
from specdec.gguf.loading import load_gguf_for_decoding
from specdec.runtime import Runtime


def block_rates(results, k: int) -> dict:
    """P(the i-th drafted token is accepted | the ones before it were), i = 1..k, over every block of full length."""
    blocks = [s for r in results for s in r.steps if s.kind == "block" and s.drafted == k]
    reached = [sum(s.accepted >= i for s in blocks) for i in range(k + 1)]
    return {"blocks": len(blocks), **{f"p{i}": reached[i] / reached[i - 1] if reached[i - 1] else float("nan")
                                      for i in range(1, k + 1)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head", default="resources/models/coder-head")
    parser.add_argument("--gguf", default="resources/gguf/qwen2.5-coder-1.5b-instruct.gguf")
    parser.add_argument("--train", default="resources/feature_head/prompts.parquet")
    parser.add_argument("--evaluation", default="results/study/prompts/{domain}.parquet")
    parser.add_argument("--domains", nargs="+", default=["code", "factual"])
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    target, _ = load_gguf_for_decoding(args.gguf, Runtime(weights="gguf", threads=args.threads))
    draft = FeatureHeadDraft(FeatureHead.load(args.head), target, dtype=torch.bfloat16)
    train = pd.read_parquet(args.train)
    rows = []
    for domain in args.domains:
        sets = {"training": train[train["prompt_id"].str.startswith(f"{domain}-")].head(args.prompts),
                "evaluation": pd.read_parquet(args.evaluation.format(domain=domain)).head(args.prompts)}
        for name, prompts in sets.items():
            results = [generate_speculative(target, draft, torch.tensor([list(ids)]), args.k, args.tokens)
                       for ids in prompts["input_ids"]]
            drafted = sum(r.drafted for r in results)
            rows.append({"domain": domain, "prompts": name, "n": len(results),
                         "acceptance": sum(r.accepted for r in results) / drafted, **block_rates(results, args.k)})
            print(rows[-1], flush=True)
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
