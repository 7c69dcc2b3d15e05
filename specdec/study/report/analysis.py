"""From per-sequence rows to the study's tables: greedy identity counts and acceptance / tokens per pass / speedup."""

from __future__ import annotations

import numpy as np
import pandas as pd

from specdec.study.stats import bootstrap_median_interval

PAIR_KEYS = ["setting", "draft", "domain", "k", "seed", "temperature", "prompt_id", "repeat"]
STUDY_COLUMNS = ["draft", "domain", "k", "temperature", "acceptance", "tokens_per_pass", "speedup_median",
                 "speedup_lo", "speedup_hi", "n_prompts", "n_repeats"]
IDENTITY_COLUMNS = ["draft", "domain", "k", "n_sequences", "n_identical", "n_near_tie", "n_divergent"]


def speedup_pairs(sequences: pd.DataFrame) -> pd.DataFrame:
    """One row per (job, prompt, repeat): baseline seconds, speculative seconds, their ratio."""
    seconds = sequences.pivot_table(index=PAIR_KEYS, columns="method", values="total_seconds", aggfunc="first")
    pairs = seconds.rename(columns={"baseline": "baseline_seconds", "speculative": "speculative_seconds"})
    pairs["speedup"] = pairs["baseline_seconds"] / pairs["speculative_seconds"]
    return pairs.reset_index()


def study_table(sequences: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """acceptance = accepted / drafted and tokens_per_pass = tokens / target passes, pooled over the group's
    speculative sequences; speedup median with a bootstrap interval over prompts x repeats (x seeds)."""
    spec = sequences[sequences["method"] == "speculative"]
    pairs = speedup_pairs(sequences)
    rows = []
    for (draft, domain, k, temperature), group in spec.groupby(["draft", "domain", "k", "temperature"]):
        ratios = pairs[(pairs.draft == draft) & (pairs.domain == domain) & (pairs.k == k)
                       & (pairs.temperature == temperature)]["speedup"].to_numpy()
        median, lo, hi = bootstrap_median_interval(ratios, seed=seed)
        rows.append({
            "draft": draft, "domain": domain, "k": int(k), "temperature": float(temperature),
            "acceptance": group["accepted"].sum() / group["drafted"].sum(),
            "tokens_per_pass": group["n_tokens"].sum() / group["target_passes"].sum(),
            "speedup_median": median, "speedup_lo": lo, "speedup_hi": hi,
            "n_prompts": group["prompt_id"].nunique(), "n_repeats": group["repeat"].nunique(),
        })
    return pd.DataFrame(rows, columns=STUDY_COLUMNS).sort_values(["draft", "temperature", "domain", "k"])


def classify_greedy(sequences: pd.DataFrame) -> pd.DataFrame:
    """The greedy speculative rows with a verdict: identical, near_tie (diagnosed rounding) or divergent."""
    spec = sequences[(sequences["method"] == "speculative") & (sequences["setting"] == "greedy")].copy()
    near_tie = spec.get("near_tie", pd.Series(False, index=spec.index)).fillna(False).astype(bool)
    spec["verdict"] = np.where(spec["identical"].astype(bool), "identical",
                               np.where(near_tie, "near_tie", "divergent"))
    return spec


def greedy_identity_table(classified: pd.DataFrame) -> pd.DataFrame:
    counts = classified.groupby(["draft", "domain", "k"])["verdict"].value_counts().unstack(fill_value=0)
    table = pd.DataFrame({
        "n_sequences": counts.sum(axis=1),
        "n_identical": counts.get("identical", 0),
        "n_near_tie": counts.get("near_tie", 0),
        "n_divergent": counts.get("divergent", 0),
    }).reset_index()
    return table[IDENTITY_COLUMNS]


def to_markdown(table: pd.DataFrame, floatfmt: str = ".3f") -> str:
    return table.to_markdown(index=False, floatfmt=floatfmt) + "\n"


DISTRIBUTION_COLUMNS = ["draft", "domain", "prompt_id", "k", "n_samples", "chi2", "dof", "p_value",
                        "wrong_sampler_p_value"]
# After them, in this order where present: the verdict, then what the verdict rests on (docs/distribution-check.md).
DISTRIBUTION_VERDICT_COLUMNS = ["threshold", "passed", "outcome", "wrong_sampler", "tv_distance", "power",
                                "has_power", "n_needed"]
OUTCOMES = {
    "pass": "the speculative samples fit the target's law and the wrong sampler was rejected",
    "no power": "no power on this prompt: at the allowed N the test could not tell the wrong sampler from the "
                "target (not a failure, but it shows nothing)",
    "FAIL correct sampler rejected": "the speculative samples do not fit the target's exact law",
    "FAIL impossible sample": "a speculative sample fell on a continuation of target probability 0",
    "FAIL wrong sampler not rejected": "the test had power against the wrong sampler and did not reject it",
}


def judge_distribution_checks(checks: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """Bonferroni over the family of correct-sampler tests: each is judged at alpha / len(checks).

    outcome: a FAIL when a sample fell on an impossible continuation, when the correct sampler's p-value is at or
    below the threshold, or when a test with power (has_power; rows without that column count as having it) has
    the wrong sampler's p-value at or above it; "no power" for a test without power whose correct sampler passed;
    else "pass". passed: the outcome is not a FAIL (a test without power is not a failure; whether enough tests
    have power is judged over the family by specdec.study.verify.distribution_verdict.failure_messages)."""
    threshold = alpha / len(checks)
    table = checks.copy()
    table["threshold"] = threshold
    has_power = table["has_power"].astype(bool) if "has_power" in table else pd.Series(True, index=table.index)
    wrong_rejected = table["wrong_sampler_p_value"] < threshold
    table["outcome"] = np.select(
        [table["impossible"] > 0, table["p_value"] <= threshold, has_power & ~wrong_rejected, ~has_power],
        ["FAIL impossible sample", "FAIL correct sampler rejected", "FAIL wrong sampler not rejected", "no power"],
        "pass")
    table["passed"] = ~table["outcome"].str.startswith("FAIL")
    first = DISTRIBUTION_COLUMNS + [c for c in DISTRIBUTION_VERDICT_COLUMNS if c in table.columns]
    return table[first + [c for c in table.columns if c not in first]]


def reproduction_table(first: pd.DataFrame, rerun: pd.DataFrame) -> pd.DataFrame:
    """Per (draft, domain, k), over the prompts the rerun covered: acceptance and tokens per pass of the first run
    and of the rerun (which must agree exactly, as must every speculative sequence's tokens), and the rerun's wall
    speedups: median, spread across prompts x repeats (min, quartiles, max) and the median of each repeat."""
    keys = ["draft", "domain", "k"]
    rows = []
    for key, again in rerun.groupby(keys):
        before = first.set_index(keys).loc[[key]].reset_index()
        # A rerun may cover the first N prompts only (reproduce.prompts_per_domain): compare those prompts.
        before = before[before["prompt_id"].isin(set(again["prompt_id"]))]
        spec_before = before[before["method"] == "speculative"]
        spec_again = again[again["method"] == "speculative"]
        # greedy: every repeat of every run must decode the first run's tokens for that prompt
        reference = {r.prompt_id: list(r.tokens) for r in spec_before.itertuples()}
        same_tokens = all(list(r.tokens) == reference.get(r.prompt_id) for r in spec_again.itertuples())
        same_tokens &= all(list(r.tokens) == reference[r.prompt_id] for r in spec_before.itertuples())
        pooled = {}
        for name, frame in (("first", spec_before), ("rerun", spec_again)):
            # every repeat of a greedy rerun decodes the same tokens, so pool one repeat for the rates
            frame = frame[frame["repeat"] == frame["repeat"].min()]
            pooled[f"acceptance_{name}"] = frame["accepted"].sum() / frame["drafted"].sum()
            pooled[f"tokens_per_pass_{name}"] = frame["n_tokens"].sum() / frame["target_passes"].sum()
        speedups = speedup_pairs(again)
        per_repeat = speedups.groupby("repeat")["speedup"].median()
        rows.append(dict(
            zip(keys, key), **pooled, same_tokens=same_tokens,
            reproduced=same_tokens and pooled["acceptance_first"] == pooled["acceptance_rerun"]
            and pooled["tokens_per_pass_first"] == pooled["tokens_per_pass_rerun"],
            speedup_first=float(speedup_pairs(before)["speedup"].median()),
            speedup_median=float(speedups["speedup"].median()), speedup_min=float(speedups["speedup"].min()),
            speedup_q1=float(speedups["speedup"].quantile(0.25)), speedup_q3=float(speedups["speedup"].quantile(0.75)),
            speedup_max=float(speedups["speedup"].max()),
            speedup_by_repeat=" ".join(f"{v:.2f}" for v in per_repeat), n_pairs=len(speedups),
        ))
    return pd.DataFrame(rows)
