"""Side by side with what a user would pick instead: Hugging Face `generate` (greedy) and its assisted generation
(`assistant_model=draft`, a constant k, no confidence stop), against our baseline and speculative decoding, on the
same models, prompts and lengths, interleaved in one process with the order rotating per prompt and repeat.

Hugging Face runs the model as shipped (torch's nn.Linear, see kernels.default_linear); ours runs as the study does.
"""

from __future__ import annotations

import time
from typing import Callable

import pandas as pd
import torch

from specdec.fp32.kernels import default_linear
from specdec.study.decoding.interleave import run_interleaved
from specdec.study.decoding.jobs import baseline_or_speculative
from specdec.study.stats import bootstrap_median_interval

METHODS = ("hf_generate", "ours_baseline", "hf_assisted", "ours_spec")
PEERS_COLUMNS = ["draft", "domain", "k", "hf_generate_s_per_token", "ours_baseline_s_per_token",
                 "hf_assisted_s_per_token", "ours_spec_s_per_token", "base_speed_ratio", "spec_speed_ratio"]


def _greedy_kwargs(max_new_tokens: int, eos_token_ids) -> dict:
    # Override the checkpoint's generation_config (Qwen's samples, with a repetition penalty): plain greedy.
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_k=None, top_p=None,
                  repetition_penalty=None)
    if eos_token_ids:  # stop where our loops stop
        kwargs.update(eos_token_id=sorted(eos_token_ids), pad_token_id=sorted(eos_token_ids)[0])
    return kwargs


@torch.inference_mode()
def hf_generate(target, input_ids: torch.Tensor, max_new_tokens: int, eos_token_ids,
                draft=None, k: int | None = None) -> tuple[list[int], float]:
    """Hugging Face greedy generation, assisted by `draft` with a constant k when given; (new tokens, seconds)."""
    kwargs = _greedy_kwargs(max_new_tokens, eos_token_ids)
    if draft is not None:
        kwargs.update(assistant_model=draft, num_assistant_tokens=k, num_assistant_tokens_schedule="constant",
                      assistant_confidence_threshold=0.0)
    mask = torch.ones_like(input_ids)
    with default_linear(target), (default_linear(draft) if draft is not None else _nothing()):
        start = time.perf_counter()
        out = target.generate(input_ids, attention_mask=mask, **kwargs)
        seconds = time.perf_counter() - start
    return out[0, input_ids.shape[1]:].tolist(), seconds


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def run_peers_job(target, draft, prompts: pd.DataFrame, k: int, max_new_tokens: int, repeats: int,
                  eos_token_ids, log: Callable[[str], None] = print) -> pd.DataFrame:
    """One row per (prompt, repeat, method): seconds, tokens and seconds per token."""
    rows = []
    turns = run_interleaved(
        prompts, METHODS, lambda m, input_ids, n: _run_method(m, target, draft, input_ids, k, n, eos_token_ids),
        max_new_tokens, repeats, log, n_tokens=lambda result: len(result[0]),
        describe=lambda t: ", ".join(f"{m} {t.results[m][1] / len(t.results[m][0]):.3f}s/token" for m in METHODS))
    for turn in turns:
        reference = turn.results["ours_baseline"][0]
        for method, (tokens, seconds) in turn.results.items():
            rows.append(dict(prompt_id=turn.prompt.prompt_id, repeat=turn.repeat, method=method, seconds=seconds,
                             n_tokens=len(tokens), s_per_token=seconds / len(tokens),
                             same_tokens_as_ours_baseline=tokens == reference))
    return pd.DataFrame(rows)


def _run_method(method, target, draft, input_ids, k, max_new_tokens, eos_token_ids) -> tuple[list[int], float]:
    """One of METHODS, greedy: (new tokens, seconds). Our two go through the study's own decoding call
    (jobs.baseline_or_speculative); Hugging Face's two through hf_generate."""
    if method == "hf_generate":
        return hf_generate(target, input_ids, max_new_tokens, eos_token_ids)
    if method == "hf_assisted":
        return hf_generate(target, input_ids, max_new_tokens, eos_token_ids, draft=draft, k=k)
    result = baseline_or_speculative(k if method == "ours_spec" else None, target, draft, input_ids, max_new_tokens)
    return result.tokens, result.total_seconds


def peers_table(runs: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per (draft, domain, k): median seconds per token of each method over prompts x repeats, and the speed ratios
    HF / ours (> 1: we are faster) as medians of per-(prompt, repeat) ratios with bootstrap intervals."""
    keys = ["draft", "domain", "k"]
    rows = []
    for key, group in runs.groupby(keys):
        wide = group.pivot_table(index=["prompt_id", "repeat"], columns="method", values="s_per_token")
        base = (wide["hf_generate"] / wide["ours_baseline"]).to_numpy()
        spec = (wide["hf_assisted"] / wide["ours_spec"]).to_numpy()
        row = dict(zip(keys, key), **{f"{m}_s_per_token": float(wide[m].median()) for m in METHODS})
        for name, ratios in (("base_speed_ratio", base), ("spec_speed_ratio", spec)):
            median, lo, hi = bootstrap_median_interval(ratios, seed=seed)
            row.update({name: median, f"{name}_lo": lo, f"{name}_hi": hi})
        row["ours_speedup"] = float(pd.Series(wide["ours_baseline"] / wide["ours_spec"]).median())
        row["hf_assisted_speedup"] = float(pd.Series(wide["hf_generate"] / wide["hf_assisted"]).median())
        row["n_pairs"] = len(wide)
        row["all_tokens_identical"] = bool(group["same_tokens_as_ours_baseline"].all())
        rows.append(row)
    table = pd.DataFrame(rows)
    return table[PEERS_COLUMNS + [c for c in table.columns if c not in PEERS_COLUMNS]]
