"""Before/after measurement of a draft change (e.g. its dtype) on the same prompts, in one process, interleaved.

For each prompt the baseline and speculative decoding with every draft variant at every k run back to back, their
order rotating from prompt to prompt (interleave.py), so that a noisy shared machine slows all of them alike. Each
variant's speedup is the per-prompt ratio baseline seconds / speculative seconds; its draft cost ratio c is its median
draft step over the median baseline step of the same runs.
"""

from __future__ import annotations

from typing import Callable, Mapping

import pandas as pd

from specdec.decode import generate_baseline, generate_speculative
from specdec.study.cost.model import one_token_calls
from specdec.study.decoding.interleave import run_interleaved
from specdec.study.stats import bootstrap_median_interval

AB_COLUMNS = ["variant", "k", "n_prompts", "speedup_median", "speedup_lo", "speedup_hi", "acceptance",
              "tokens_per_pass", "draft_step_ms", "baseline_step_ms", "c", "all_tokens_identical"]


def run_draft_ab(target, drafts: Mapping[str, object], prompts: pd.DataFrame, ks, max_new_tokens: int,
                 log: Callable[[str], None] = print) -> pd.DataFrame:
    """One row per (prompt, k, method): method 'baseline' or a key of `drafts` (greedy decoding). The baseline runs
    once per prompt, interleaved with every (variant, k); its row is repeated under each k."""
    methods = ["baseline", *[(variant, k) for k in ks for variant in drafts]]

    def run(method, input_ids, n):
        if method == "baseline":
            return generate_baseline(target, input_ids, n)
        variant, k = method
        return generate_speculative(target, drafts[variant], input_ids, k, n)

    rows = []
    for turn in run_interleaved(prompts, methods, run, max_new_tokens, log=log):
        reference = turn.results["baseline"]
        for k in ks:
            for method in ["baseline", *drafts]:
                result = turn.results["baseline" if method == "baseline" else (method, k)]
                steps = pd.DataFrame(result.step_rows())
                # The first draft call of a block that also catches up is timed as catch-up, not as a draft step.
                n_draft_steps = one_token_calls(steps)
                draft_steps = steps["draft_seconds"] / n_draft_steps.where(n_draft_steps > 0)
                rows.append(dict(prompt_id=turn.prompt.prompt_id, k=k, method=method, seconds=result.total_seconds,
                                 acceptance=result.acceptance, tokens_per_pass=result.tokens_per_pass,
                                 step_seconds=float(steps.loc[steps["kind"] != "prefill", "verify_seconds"].median()),
                                 draft_step_seconds=float(draft_steps.median()),
                                 identical=result.tokens == reference.tokens))
    return pd.DataFrame(rows)


def draft_ab_table(runs: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per (variant, k): median speedup over prompts with a bootstrap 95% interval, acceptance, tokens per pass,
    draft step, baseline step and their ratio c."""
    base = runs[runs["method"] == "baseline"].set_index(["prompt_id", "k"])
    out = []
    for (variant, k), group in runs[runs["method"] != "baseline"].groupby(["method", "k"], sort=False):
        group = group.set_index(["prompt_id", "k"])
        speedups = (base.loc[group.index, "seconds"] / group["seconds"]).to_numpy()
        median, lo, hi = bootstrap_median_interval(speedups, seed=seed)
        draft_ms = 1e3 * float(group["draft_step_seconds"].median())
        base_ms = 1e3 * float(base.loc[group.index, "step_seconds"].median())
        out.append(dict(variant=variant, k=k, n_prompts=len(group), speedup_median=median,
                        speedup_lo=lo, speedup_hi=hi, acceptance=float(group["acceptance"].mean()),
                        tokens_per_pass=float(group["tokens_per_pass"].mean()), draft_step_ms=draft_ms,
                        baseline_step_ms=base_ms, c=draft_ms / base_ms,
                        all_tokens_identical=bool(group["identical"].all())))
    return pd.DataFrame(out, columns=AB_COLUMNS)
