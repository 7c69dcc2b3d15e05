"""Step and pass costs from llama-bench, and the speedup the cost model predicts from them."""

from __future__ import annotations

import numpy as np
import pandas as pd


def step_costs(bench: pd.DataFrame) -> pd.DataFrame:
    """Per model: the one-token step (tg: seconds per generated token, every repetition of every round) and the
    pass over m positions (pp m), medians with bootstrap intervals; ratio_to_step = pass(m) / step."""
    from specdec.study.stats import bootstrap_median_interval

    rows = []
    for model, frame in bench.groupby("model", sort=False):
        tg = frame[frame["n_gen"] > 0]
        step = np.concatenate([np.asarray(s) / n for s, n in zip(tg["samples_s"], tg["n_gen"])]) if len(tg) else []
        med, lo, hi = bootstrap_median_interval(np.asarray(step))
        rows.append({"model": model, "m": 0, "what": "step (tg)", "seconds": med, "seconds_lo": lo, "seconds_hi": hi,
                     "n_depth": int(frame["n_depth"].iloc[0]), "n_threads": int(frame["n_threads"].iloc[0])})
        pp = frame[(frame["n_prompt"] > 0) & (frame["n_gen"] == 0)]
        for m, sub in pp.groupby("n_prompt"):
            med, lo, hi = bootstrap_median_interval(np.concatenate([np.asarray(s) for s in sub["samples_s"]]))
            rows.append({"model": model, "m": int(m), "what": f"pass of {m} positions (pp)", "seconds": med,
                         "seconds_lo": lo, "seconds_hi": hi, "n_depth": int(sub["n_depth"].iloc[0]),
                         "n_threads": int(sub["n_threads"].iloc[0])})
    out = pd.DataFrame(rows)
    # relative to the steady one-token step (tg, many tokens per sample), not to pp 1 (one decode per sample, noisy)
    step = out[out["m"] == 0].set_index("model")["seconds"]
    out["ratio_to_step"] = out.apply(lambda r: r["seconds"] / step.get(r["model"], np.nan), axis=1)
    return out


def cost_seconds(costs: pd.DataFrame, model: str, m: int) -> float:
    """A model's measured seconds in step_costs' table: its one-token step (m 0) or its pass over m positions;
    NaN where that was not measured."""
    sel = costs[(costs["model"] == model) & (costs["m"] == m)]["seconds"]
    return float(sel.iloc[0]) if len(sel) else float("nan")


def predicted_llamacpp_speedup(tokens_per_pass: float, costs: pd.DataFrame, target: str, draft: str, k: int) -> float:
    """costmodel.predicted_speedup with llama.cpp's measured costs and draft-simple's work per pass: k one-token draft
    calls (the first on the previous pass's last token) plus one draft pass over the k + 1 verified positions
    (common_speculative_process feeds the target's batch to the draft), i.e. the catch-up call every pass."""
    from specdec.study.cost.model import predicted_speedup

    t1 = cost_seconds(costs, target, 0)
    td = cost_seconds(costs, draft, 0)
    verify = cost_seconds(costs, target, k + 1)
    catchup = td + cost_seconds(costs, draft, k + 1)
    return predicted_speedup(tokens_per_pass, t1, td, verify, catchup, 1.0, k=k)
