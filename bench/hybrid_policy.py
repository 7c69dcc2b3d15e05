"""Which hybrid-draft policy pays on which domain: an offline simulation at temperature 0.

At temperature 0 a block's outcome is fixed by the target's greedy tokens and the draft's argmax along them, so the
tokens per target pass of any policy (lookup's shortest n-gram `ngram_min`, the model's `min_confidence` stop, k)
follow from one study run and one teacher-forced forward of the draft per prompt, with no decoding. Block costs:
T(m)/T(1) of the target from `verify_cost.csv`, the target's step from `step_timings.csv` (the study's committed
tables, same machine), the bf16 draft's forward over 1-64 rows timed here (its step, and the catch-up over the tokens
lookup drafted). The draft's confidence after its first mismatch is read along the target's tokens (an
approximation: the real draft has then gone its own way). A guide to what to measure, not a measurement: the
decoding-phase speedups it prints run 5-20% above the study's. Run it alone on the machine.

    python bench/hybrid_policy.py --domains code dialogue
"""

import argparse
import itertools
import statistics
import time

import numpy as np
import pandas as pd
import torch

from specdec.drafts.hybrid import lookup_drafts_block
from specdec.drafts.lookup import PromptLookupDraft
from specdec.fp32.kernels import use_row_adaptive_bf16_linear
from specdec.lm import CachedLM
from specdec.fp32.loading import load_model

CATCHUP_ROWS = (1, 2, 9, 16, 32, 64)


def draft_seconds_by_rows(model, repeats: int = 3) -> dict[int, float]:
    """Median seconds of the draft's forward over m new tokens after a 128-token context."""
    session, seconds = CachedLM(model), {}
    for m in CATCHUP_ROWS:
        times = []
        for _ in range(repeats + 1):
            session.reset()
            session.extend(list(range(1000, 1128)), 1)
            start = time.perf_counter()
            session.extend(list(range(2000, 2000 + m)), 1)
            times.append(time.perf_counter() - start)
        seconds[m] = statistics.median(times[1:])
    return seconds


def simulate(prompt, generated, draft_argmax, draft_confidence, lookup, min_confidence, k, cost) -> float:
    """Seconds of the decoding phase (after the prompt pass) under one policy; cost(kind, n) prices the parts."""
    i, seconds, model_seen = 1, 0.0, 0  # token 0 comes from the prompt pass; the model's prefill is deferred
    n = len(prompt)
    while i < len(generated):
        budget = min(k, len(generated) - i)
        proposal = lookup.lookup(prompt + generated[:i], budget)
        if lookup_drafts_block(proposal):  # the engine's policy, as HybridDraft decides
            accepted = next((a for a, token in enumerate(proposal) if token != generated[i + a]), len(proposal))
            drafted = len(proposal)
        else:
            seconds += cost("draft", n + i - model_seen)  # the first call feeds everything the model has not seen
            accepted, drafted, matching = 0, 1, True
            while True:
                j = i + drafted - 1
                matching = matching and draft_argmax[j] == generated[j]
                accepted += matching
                if drafted >= budget or (min_confidence is not None and draft_confidence[j] < min_confidence):
                    break
                drafted += 1
                seconds += cost("draft", 1)
            # the model keeps what it fed and the target kept: its last drafted token is never fed
            model_seen = n + i + min(accepted, drafted - 1)
        seconds += cost("verify", drafted + 1)
        i += accepted + 1
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domains", nargs="+", default=["code", "dialogue"])
    parser.add_argument("--results", default="results/study")
    parser.add_argument("--draft", default="resources/models/qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--run", default="runs/greedy/coder-0.5b-hybrid/{domain}/k4/seed0/sequences.parquet")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    verify = pd.read_csv(f"{args.results}/tables/verify_cost.csv").query("model == @args.target")
    verify_ratio = verify.set_index("m")["estimate"]
    t1 = pd.read_csv(f"{args.results}/tables/step_timings.csv")["target_step_seconds"].median()
    model, _ = load_model(args.draft, dtype="bfloat16")
    use_row_adaptive_bf16_linear(model, default="avx2-bf16")
    rows = draft_seconds_by_rows(model)
    print(f"target step {t1 * 1e3:.0f} ms; draft forward by new tokens: "
          + ", ".join(f"{m}: {s * 1e3:.0f} ms" for m, s in rows.items()))

    def cost(kind: str, n: int) -> float:
        if kind == "verify":
            return t1 * float(verify_ratio.loc[n])
        return float(np.interp(n, list(rows), list(rows.values())))

    records = []
    for domain in args.domains:
        prompts = pd.read_parquet(f"{args.results}/prompts/{domain}.parquet").set_index("prompt_id")
        runs = pd.read_parquet(f"{args.results}/{args.run.format(domain=domain)}").query("method == 'baseline'")
        for run in runs.itertuples():
            prompt, generated = [int(t) for t in prompts.loc[run.prompt_id, "input_ids"]], [int(t) for t in run.tokens]
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prompt + generated])).logits[0, len(prompt) - 1:-1].float()
            confidence, argmax = torch.softmax(logits, dim=-1).max(dim=-1)
            baseline = (len(generated) - 1) * t1
            for ngram_min, min_confidence, k in itertools.product((1, 2, 3), (None, 0.3, 0.6), (2, 4, 8)):
                lookup = PromptLookupDraft(logits.shape[-1], 3, ngram_min)
                seconds = simulate(prompt, generated, argmax.tolist(), confidence.tolist(), lookup, min_confidence,
                                   k, cost)
                records.append({"domain": domain, "prompt_id": run.prompt_id, "ngram_min": ngram_min,
                                "min_confidence": min_confidence or 0.0, "k": k,
                                "decode_speedup": baseline / seconds})
    table = pd.DataFrame(records).groupby(["domain", "ngram_min", "min_confidence", "k"])["decode_speedup"].median()
    print("median decoding-phase speedup over prompts (the study's policy: ngram_min 1, min_confidence 0):")
    print(table.unstack("k").round(2).to_string())


if __name__ == "__main__":
    main()
