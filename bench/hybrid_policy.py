"""Which hybrid-draft policy pays on which domain: an offline simulation at temperature 0.

At temperature 0 a block's outcome is fixed by the target's greedy tokens and the draft's argmax along them, so the
tokens per target pass of any policy (lookup's n-gram lengths `ngram_min`..`ngram_max`, the model's `min_confidence`
stop and `model_k` cap, k) follow from one run and one teacher-forced forward of the draft per prompt, with no
decoding. The draft's confidence after its first mismatch is read along the target's tokens (an approximation: the
real draft has then gone its own way). A guide to what to measure, not a measurement. Run it alone on the machine.

fp32 (the study's bf16 draft): the target's tokens from a study run, T(m)/T(1) from `verify_cost.csv` and the step
from `step_timings.csv` (committed tables, same machine), the draft's forward over 1-64 new tokens timed here; its
decoding-phase speedups ran 5-20% above the study's.

    python bench/hybrid_policy.py --domains code dialogue

gguf (the lean engine): the target's tokens from a side by side's runs (our plain runs, first repeat), the draft
file with its head limited to `--vocab` ids, and both engines' passes timed here (the target over 1-9 positions, the
draft over 1-32 new tokens after a 128-token context, interleaved, medians); the model's prompt pass as its
`defer_prefill` says. On the cpu-lead ninth run's outputs (AMD EPYC Zen 4) it put that run's long-lookup hybrid
first, at 1.83x our plain on code and 1.11-1.17x elsewhere, against the side by side's measured 1.88x and
1.19-1.24x.

    python bench/hybrid_policy.py --regime gguf --runs results/experiments/cpu-lead/<machine> \\
        --domains code factual dialogue prose [--head-type q5_0] [--k 4 6 8 --ngram-max 8 12 --sort code]

`--k` and `--ngram-max` set the gguf grid's blocks (up to 8: the target's passes are timed to 9 positions) and longest
n-grams; on the tenth run's outputs, k 8 put the long-lookup hybrid at 2.22x our plain on code against 2.20 at k 6.

Printed before the policies: how often the draft's argmax along the target's tokens is the target's token, per domain (the share a
greedy draft's first token is kept), a quick way to weigh a cheaper draft head (`--vocab`, `--head-type`).
"""

import argparse
import itertools
import statistics
import time

import numpy as np
import pandas as pd
import torch

from specdec.drafts.hybrid import lookup_drafts_block, model_block_budget
from specdec.drafts.lookup import PromptLookupDraft

CATCHUP_ROWS = (1, 2, 9, 16, 32, 64)
GGUF_CATCHUP_ROWS = (1, 2, 4, 9, 16, 32)
GGUF_VERIFY_ROWS = tuple(range(1, 10))


def pass_seconds(session, rows, repeats: int = 3, all_logits: bool = False) -> dict[int, float]:
    """Median seconds of a session's forward over m new tokens after a 128-token context, for each m of `rows`, the
    m interleaved round by round (the first round a warm-up); all_logits: the logits of every new token (a verify
    pass), else of the last (a draft's catch-up)."""
    times = {m: [] for m in rows}
    for repeat in range(repeats + 1):
        for m in rows[repeat % len(rows):] + rows[:repeat % len(rows)]:
            session.reset()
            session.extend(list(range(1000, 1128)), 1)
            start = time.perf_counter()
            session.extend(list(range(2000, 2000 + m)), m if all_logits else 1)
            if repeat:
                times[m].append(time.perf_counter() - start)
    return {m: statistics.median(times[m]) for m in rows}


def simulate(prompt, generated, draft_argmax, draft_confidence, lookup, min_confidence, k, cost, *,
             model_k=None, defer_prefill=True) -> float:
    """Seconds of the decoding phase (after the prompt pass) under one policy; cost(kind, n) prices the parts:
    ("draft", new tokens) a draft forward, ("verify", positions) a target pass. draft_argmax[j] / draft_confidence[j]:
    the draft's choice for generated[j] and its probability, teacher-forced."""
    i, seconds = 1, 0.0  # token 0 comes from the prompt pass
    n = len(prompt)
    model_seen = 0 if defer_prefill else n  # an eager prompt pass belongs to the prompt phase
    while i < len(generated):
        budget = min(k, len(generated) - i)
        proposal = lookup.lookup(prompt + generated[:i], budget)
        if lookup_drafts_block(proposal):  # the engine's policy, as HybridDraft decides
            accepted = next((a for a, token in enumerate(proposal) if token != generated[i + a]), len(proposal))
            drafted = len(proposal)
        else:
            model_budget = model_block_budget(budget, model_k)  # as HybridDraft decides
            seconds += cost("draft", n + i - model_seen)  # the first call feeds everything the model has not seen
            accepted, drafted, matching = 0, 1, True
            while True:
                j = i + drafted - 1
                matching = matching and draft_argmax[j] == generated[j]
                accepted += matching
                if drafted >= model_budget or (min_confidence is not None and draft_confidence[j] < min_confidence):
                    break
                drafted += 1
                seconds += cost("draft", 1)
            # the model keeps what it fed and the target kept: its last drafted token is never fed
            model_seen = n + i + min(accepted, drafted - 1)
        seconds += cost("verify", drafted + 1)
        i += accepted + 1
    return seconds


def teacher_forced(logits: torch.Tensor) -> tuple[list[int], list[float]]:
    confidence, argmax = torch.softmax(logits.float(), dim=-1).max(dim=-1)
    return argmax.tolist(), confidence.tolist()


def fp32_setup(args):
    from specdec.fp32.kernels import use_row_adaptive_bf16_linear
    from specdec.fp32.loading import load_model
    from specdec.lm import CachedLM

    verify = pd.read_csv(f"{args.results}/tables/verify_cost.csv").query("model == @args.target")
    verify_ratio = verify.set_index("m")["estimate"]
    t1 = pd.read_csv(f"{args.results}/tables/step_timings.csv")["target_step_seconds"].median()
    model, _ = load_model(args.draft, dtype="bfloat16")
    use_row_adaptive_bf16_linear(model, default="avx2-bf16")
    rows = pass_seconds(CachedLM(model), CATCHUP_ROWS)

    def forward(ids):
        with torch.no_grad():
            return model(input_ids=torch.tensor([ids])).logits[0]

    def runs(domain):
        prompts = pd.read_parquet(f"{args.results}/prompts/{domain}.parquet").set_index("prompt_id")
        frame = pd.read_parquet(f"{args.results}/{args.run.format(domain=domain)}").query("method == 'baseline'")
        return [(prompts.loc[r.prompt_id, "input_ids"], r.tokens, r.prompt_id) for r in frame.itertuples()]

    return t1, (lambda m: t1 * float(verify_ratio.loc[m])), rows, forward, runs


def gguf_setup(args):
    from specdec.gguf.lean import LeanLM

    target = LeanLM(args.target_file, max_length=1024)
    draft = LeanLM(args.draft_file, max_length=1024)
    if args.vocab:
        draft.limit_head_vocab(args.vocab)
    if args.head_type:
        draft.requantize_head(args.head_type.upper())
    verify = pass_seconds(target, GGUF_VERIFY_ROWS, args.repeats, all_logits=True)
    rows = pass_seconds(draft, GGUF_CATCHUP_ROWS, args.repeats)

    def forward(ids):
        draft.reset()
        return draft.extend(list(ids), len(ids))[:, :args.vocab or None]

    def runs(domain):
        prompts = pd.read_parquet(f"{args.runs}/prompts/{domain}.parquet").set_index("prompt_id")
        frame = pd.read_parquet(f"{args.runs}/vs_llamacpp/runs/{domain}.parquet")
        frame = frame.query("engine == 'specdec' and draft == 'plain'").sort_values("repeat").drop_duplicates("prompt_id")
        return [(prompts.loc[r.prompt_id, "input_ids"], r.tokens, r.prompt_id) for r in frame.itertuples()]

    return verify[1], verify.__getitem__, rows, forward, runs


def policies(regime: str, ks=(2, 4, 6), ngram_maxes=(3, 8)):
    """(ngram_min, ngram_max, min_confidence, k, model_k, defer_prefill) to simulate; ks and ngram_maxes: the gguf
    grid's blocks and longest n-grams."""
    if regime == "fp32":  # the study's grid
        return [(n, 3, c, k, None, True) for n, c, k in itertools.product((1, 2, 3), (None, 0.3, 0.6), (2, 4, 8))]
    return [(n, x, c, k, mk, False)
            for n, x, c, k, mk in itertools.product((1, 3, 4), ngram_maxes, (None, 0.5), ks, (2, 3, None))
            if n <= x and (mk is None or mk < k)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regime", choices=("fp32", "gguf"), default="fp32")
    parser.add_argument("--domains", nargs="+", default=["code", "dialogue"])
    parser.add_argument("--threads", type=int, default=2)
    fp32 = parser.add_argument_group("fp32")
    fp32.add_argument("--results", default="results/study")
    fp32.add_argument("--draft", default="resources/models/qwen2.5-coder-0.5b-instruct")
    fp32.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    fp32.add_argument("--run", default="runs/greedy/coder-0.5b-hybrid/{domain}/k4/seed0/sequences.parquet")
    gguf = parser.add_argument_group("gguf")
    gguf.add_argument("--runs", help="a side by side's results directory (prompts/, vs_llamacpp/runs/)")
    gguf.add_argument("--target-file", default="resources/gguf/qwen2.5-coder-1.5b-instruct.gguf")
    gguf.add_argument("--draft-file", default="resources/gguf/qwen2.5-coder-0.5b-instruct.gguf")
    gguf.add_argument("--vocab", type=int, default=65536, help="the draft's head vocabulary (0: all of it)")
    gguf.add_argument("--head-type", choices=("q5_0", "q8_0"), default=None,
                      help="the draft's head rows requantised to this type (the draft kinds' head_type)")
    gguf.add_argument("--repeats", type=int, default=5)
    gguf.add_argument("--top", type=int, default=15, help="policies printed, by the geometric mean over domains")
    gguf.add_argument("--k", type=int, nargs="+", default=[2, 4, 6],
                      help="the grid's blocks (at most %d: the target's passes are timed to %d positions)"
                      % (GGUF_VERIFY_ROWS[-1] - 1, GGUF_VERIFY_ROWS[-1]))
    gguf.add_argument("--ngram-max", type=int, nargs="+", default=[3, 8], help="the grid's longest n-grams")
    gguf.add_argument("--sort", default="geomean", help="the column the policies are ranked by (a domain or geomean)")
    args = parser.parse_args()
    if args.regime == "gguf" and not args.runs:
        parser.error("--regime gguf needs --runs (a side by side's results directory)")
    if any(not 1 <= k < GGUF_VERIFY_ROWS[-1] for k in args.k):
        parser.error(f"--k takes blocks of 1..{GGUF_VERIFY_ROWS[-1] - 1} tokens, got {args.k}")
    if args.sort not in ("geomean", *args.domains):
        parser.error(f"--sort takes geomean or one of --domains, got {args.sort!r}")
    torch.set_num_threads(args.threads)
    t1, verify_seconds, rows, forward, runs = (fp32_setup if args.regime == "fp32" else gguf_setup)(args)
    print(f"target step {t1 * 1e3:.1f} ms; draft forward by new tokens: "
          + ", ".join(f"{m}: {s * 1e3:.1f} ms" for m, s in rows.items()))

    def cost(kind: str, n: int) -> float:
        if kind == "verify":
            return verify_seconds(n)
        return float(np.interp(n, list(rows), list(rows.values())))

    records, agreement = [], []
    for domain in args.domains:
        for prompt, tokens, prompt_id in runs(domain):
            prompt, generated = [int(t) for t in prompt], [int(t) for t in tokens]
            logits = forward(prompt + generated)[len(prompt) - 1:-1]
            argmax, confidence = teacher_forced(logits)
            agreement.append({"domain": domain, "agreement": float(np.mean(np.array(argmax) == np.array(generated)))})
            baseline = (len(generated) - 1) * t1
            for ngram_min, ngram_max, min_confidence, k, model_k, defer in policies(args.regime, tuple(args.k), tuple(args.ngram_max)):
                lookup = PromptLookupDraft(logits.shape[-1], ngram_max, ngram_min)
                seconds = simulate(prompt, generated, argmax, confidence, lookup, min_confidence, k, cost,
                                   model_k=model_k, defer_prefill=defer)
                records.append({"domain": domain, "prompt_id": prompt_id, "ngram_min": ngram_min,
                                "ngram_max": ngram_max, "min_confidence": min_confidence or 0.0, "k": k,
                                "model_k": model_k or k, "decode_speedup": baseline / seconds})
    agreement = pd.DataFrame(agreement).groupby("domain", sort=False)["agreement"].mean()
    print("the draft's argmax along the target's tokens, the share equal to the target's token (mean over prompts): "
          + ", ".join(f"{domain} {share:.3f}" for domain, share in agreement.items()))
    frame = pd.DataFrame(records)
    if args.regime == "fp32":
        table = frame.groupby(["domain", "ngram_min", "min_confidence", "k"])["decode_speedup"].median()
        print("median decoding-phase speedup over prompts (the study's policy: ngram_min 1, min_confidence 0):")
        print(table.unstack("k").round(2).to_string())
        return
    keys = ["ngram_min", "ngram_max", "min_confidence", "k", "model_k"]
    table = frame.groupby(["domain", *keys])["decode_speedup"].median().unstack("domain")
    table["geomean"] = np.exp(np.log(table[args.domains]).mean(axis=1))
    print(f"median decoding-phase speedup over prompts, best policies first by {args.sort} (ngram_min 1, "
          "ngram_max 3, min_confidence 0, model_k = k: the study's hybrid):")
    print(table.sort_values(args.sort, ascending=False).head(args.top).round(2).to_string())


if __name__ == "__main__":
    main()
