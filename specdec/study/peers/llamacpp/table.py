"""The stage's table: one row per (draft, domain, k) of the llama.cpp runs, with the cost model's prediction
and our engine's speeds on the same prompts next to it."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from .costs import cost_seconds, predicted_llamacpp_speedup


TABLE_COLUMNS = ["draft", "domain", "k", "n_prompts", "n_repeats", "plain_tokens_per_s", "plain_tokens_per_s_lo",
                 "plain_tokens_per_s_hi", "spec_tokens_per_s", "spec_tokens_per_s_lo", "spec_tokens_per_s_hi",
                 "speedup", "speedup_lo", "speedup_hi", "acceptance", "tokens_per_pass", "n_identical", "n_compared",
                 "first_diffs", "c", "depth_ratio", "bytes_ratio", "verify_ratio_k1", "predicted_speedup",
                 "engine_baseline_tokens_per_s", "engine_spec_tokens_per_s", "engine_draft", "threads"]


def summarize(runs: pd.DataFrame, costs: pd.DataFrame, facts: dict[str, dict], target: str,
              engine: pd.DataFrame | None = None, threads: int | None = None,
              engine_fallback: Sequence[str] = ()) -> pd.DataFrame:
    """One row per (draft, domain, k) of the llama.cpp runs.

    speedup: per prompt and repeat, speculative tokens/s over plain tokens/s of the same turn; median over turns with
    a 95% bootstrap interval (as are the tokens/s). acceptance = n_accept / n_drafted and tokens_per_pass = 1 +
    accepted / verify passes (llama.cpp's '#mean acc len'), pooled over the cell's runs. n_identical of n_compared:
    speculative runs whose emitted tokens equal the plain run's (first max_new_tokens); first_diffs lists
    'prompt_id@position' of the others. c, depth and bytes ratios: draft / target; verify_ratio_k1: the target's
    pass over k + 1 positions / its one-token step (llama-bench tg, same depth and threads).
    """
    from specdec.study.stats import bootstrap_median_interval

    rows = []
    keys = ["prompt_id", "repeat"]
    for (draft, domain), cell in runs.groupby(["draft", "domain"], sort=False):
        plain = cell[cell["method"] == "plain"].set_index(keys)["tokens_per_second"]
        for k, spec in cell[cell["method"] == "speculative"].groupby("k"):
            s = spec.set_index(keys)
            ratio = (s["tokens_per_second"] / plain.reindex(s.index)).to_numpy()
            sp, sp_lo, sp_hi = bootstrap_median_interval(ratio)
            pt, pt_lo, pt_hi = bootstrap_median_interval(plain.reindex(s.index).to_numpy())
            st, st_lo, st_hi = bootstrap_median_interval(s["tokens_per_second"].to_numpy())
            tpp = 1.0 + spec["n_acc_tokens"].sum() / max(spec["n_call_accept"].sum(), 1)
            diffs = spec[~spec["identical"]]
            fd, fdepth, fbytes = facts.get(draft, {}), facts.get(target, {}), None
            if fd and fdepth:
                fbytes = fd["step_bytes"] / fdepth["step_bytes"]
            c = cost_seconds(costs, draft, 0) / cost_seconds(costs, target, 0)
            row = {"draft": draft, "domain": domain, "k": int(k), "n_prompts": spec["prompt_id"].nunique(),
                   "n_repeats": spec["repeat"].nunique(),
                   "plain_tokens_per_s": pt, "plain_tokens_per_s_lo": pt_lo, "plain_tokens_per_s_hi": pt_hi,
                   "spec_tokens_per_s": st, "spec_tokens_per_s_lo": st_lo, "spec_tokens_per_s_hi": st_hi,
                   "speedup": sp, "speedup_lo": sp_lo, "speedup_hi": sp_hi,
                   "acceptance": spec["n_accept"].sum() / max(spec["n_drafted"].sum(), 1),
                   "tokens_per_pass": tpp, "n_identical": int(spec["identical"].sum()), "n_compared": len(spec),
                   "first_diffs": ";".join(f"{r.prompt_id}@{int(r.first_diff)}" for r in diffs.itertuples()),
                   "c": c, "depth_ratio": fd["n_layers"] / fdepth["n_layers"] if fd and fdepth else float("nan"),
                   "bytes_ratio": fbytes if fbytes is not None else float("nan"),
                   "verify_ratio_k1": cost_seconds(costs, target, int(k) + 1) / cost_seconds(costs, target, 0),
                   "predicted_speedup": predicted_llamacpp_speedup(tpp, costs, target, draft, int(k)),
                   "threads": threads}
            row.update(engine_scale(engine, draft, domain, int(k), engine_fallback))
            rows.append(row)
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def engine_speeds(sequence_files: Iterable[str | os.PathLike],
                  prompt_ids: dict[str, set] | None = None) -> pd.DataFrame:
    """Our engine's tokens/s, per sequence, from greedy decode runs of the study or the draft sweep
    (sequences.parquet under [sweep/]runs/greedy/<draft>/<domain>/k<k>/seed0/): n_tokens / total_seconds, keeping only
    the prompts llama.cpp ran (`prompt_ids` per domain). Empty when there are no such files."""
    frames = []
    for path in sequence_files:
        path = Path(path)
        try:
            draft, domain, kdir = path.parts[-5], path.parts[-4], path.parts[-3]
            seq = pd.read_parquet(path, columns=["prompt_id", "method", "n_tokens", "total_seconds"])
        except (IndexError, OSError, ValueError, KeyError):
            continue
        if prompt_ids is not None:
            seq = seq[seq["prompt_id"].isin(prompt_ids.get(domain, set()))]
        if len(seq):
            frames.append(pd.DataFrame({"draft": draft, "domain": domain, "k": int(kdir.lstrip("k")),
                                        "prompt_id": seq["prompt_id"].to_numpy(), "method": seq["method"].to_numpy(),
                                        "tokens_per_s": (seq["n_tokens"] / seq["total_seconds"]).to_numpy()}))
    columns = ["draft", "domain", "k", "prompt_id", "method", "tokens_per_s"]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def engine_scale(engine: pd.DataFrame, draft: str, domain: str, k: int, fallback: Sequence[str] = ()) -> dict:
    """Our engine next to a llama.cpp cell: its plain (baseline) tokens/s on the domain's prompts, pooled over every
    run found (the baseline does not depend on the draft or k), and its speculative tokens/s at k with the same draft,
    else with the first of `fallback` (the study's drafts) that has runs; engine_draft names which. NaN without runs."""
    nan = float("nan")
    out = {"engine_baseline_tokens_per_s": nan, "engine_spec_tokens_per_s": nan, "engine_draft": None}
    if engine is None or not len(engine):
        return out
    dom = engine[engine["domain"] == domain]
    base = dom[dom["method"] == "baseline"]["tokens_per_s"]
    if len(base):
        out["engine_baseline_tokens_per_s"] = float(base.median())
    spec = dom[(dom["method"] == "speculative") & (dom["k"] == int(k))]
    for name in (draft, *fallback):
        chosen = spec[spec["draft"] == name]["tokens_per_s"]
        if len(chosen):
            out["engine_spec_tokens_per_s"], out["engine_draft"] = float(chosen.median()), name
            break
    return out
