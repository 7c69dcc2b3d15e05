"""What does one draft step of a feature head cost, against one target step? (issue 27: c <= 0.10)

    python bench/feature_head_cost.py --out results/study/tables/feature_head_cost.csv [--vocab 32768] [--rounds 30]

The cost of a head does not depend on its training, so an untrained head of the real target's shape is timed: per
round, interleaved, one target one-token step (on a context of --context tokens) and one head draft step (one
token: fc, one decoder layer, the target's final norm, the LM head rows of the drafting vocabulary), its weights in
fp32 or bf16, on the engine's native products where built. Both regimes:
the fp32 target (prepared model directory, the study's invariant kernel) and the GGUF file on the lean engine.
Medians with 95% bootstrap intervals of the ratio. A timing: run it alone."""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
import pandas as pd
import torch

from specdec.drafts.feature_head import FeatureHeadDraft, untrained_head
from specdec.gguf.loading import load_gguf_for_decoding
from specdec.fp32.kernels import linear_backends
from specdec.lm import CachedLM
from specdec.fp32.loading import load_for_decoding
from specdec.runtime import Runtime
from specdec.sampling import SamplingConfig
from specdec.study.io import write_csv
from specdec.study.machine import machine_record
from specdec.study.stats import bootstrap_median_interval


def time_pair(target_session, head_draft, context: list[int], rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """(target step seconds, head step seconds) per round, interleaved."""
    head_draft.attach_target(target_session)
    target_session.reset()
    target_session.extend(context[:-1], 1)
    head_draft.prefill(context[:-1])
    greedy, generator = SamplingConfig(0.0), torch.Generator()
    head_draft.propose(context, 1, greedy, generator)  # the catch-up on the prompt, not timed
    target_s, head_s = [], []
    for _ in range(rounds + 3):
        length = target_session.length
        start = time.perf_counter()
        target_session.extend([context[-1]], 1)
        target_s.append(time.perf_counter() - start)
        target_session.crop(length)
        # one head step: its cache forgets the last position, which the proposal feeds again (one row) and drafts from
        head_draft.rollback(len(context) - 2)
        proposal = head_draft.propose(context, 1, greedy, generator)
        head_s.append(proposal.draft_seconds + proposal.catchup_seconds)
    return np.array(target_s[3:]), np.array(head_s[3:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--vocab", type=int, nargs="+", default=[32768, 8192])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="results/study/tables/feature_head_cost.csv")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    context = torch.randint(1000, 20000, (args.context + 1,), generator=torch.Generator().manual_seed(0)).tolist()
    fp32, _ = load_for_decoding(f"resources/models/{args.model}", Runtime(threads=args.threads))
    lean, _ = load_gguf_for_decoding(f"resources/gguf/{args.model}.gguf", Runtime(weights="gguf",
                                                                                 threads=args.threads))
    machine, rows = machine_record(args.threads), []
    for vocab, dtype in itertools.product(args.vocab, args.dtypes):
        head = untrained_head(fp32, range(min(vocab, fp32.config.vocab_size))).float()
        for regime, session, target in (("fp32", CachedLM(fp32), fp32), ("gguf", lean, lean)):
            draft = FeatureHeadDraft(head, target, dtype=getattr(torch, dtype))
            target_s, head_s = time_pair(session, draft, context, args.rounds)
            ratio, lo, hi = bootstrap_median_interval(head_s / target_s)
            rows.append({"regime": regime, "drafting_vocabulary": len(head.draft_vocab), "head_dtype": dtype,
                         "head_products": linear_backends(draft.head, 1), "context": args.context,
                         "target_step_ms": 1e3 * float(np.median(target_s)),
                         "head_step_ms": 1e3 * float(np.median(head_s)), "c": ratio, "c_lo": lo, "c_hi": hi,
                         "rounds": args.rounds, "threads": args.threads, "machine": machine["id"],
                         "date": time.strftime("%Y-%m-%d")})
            print(rows[-1])
    write_csv(pd.DataFrame(rows), args.out)


if __name__ == "__main__":
    main()
