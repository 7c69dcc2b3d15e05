"""One decoding job of the study: baseline and speculative decoding over a prompt set, interleaved in one process.

Per prompt and repeat the baseline and the speculative loop (at one k, or at several: the draft sweep) run back to
back in rotating order (interleave.py), so that slow drifts of a shared machine hit all of them alike; speedups are
then ratios of timings taken seconds apart. Greedy runs are compared token for token on the spot and any divergence
is diagnosed while the models are loaded (diagnose.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Callable

import pandas as pd

from specdec.decode import DecodeResult, generate_baseline, generate_speculative
from specdec.study.decoding.interleave import Turn, batch_of_one, run_interleaved
from specdec.study.verify.diagnose import diagnose_divergence
from specdec.study.verify.divergence import first_difference


@dataclass(frozen=True)
class DecodeJob:
    setting: str  # 'greedy' or 'sampled'
    draft: str
    domain: str
    k: int
    seed: int
    max_new_tokens: int
    repeats: int = 1
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None


def _batch_invariant(target) -> bool:
    """A target whose logits are the same bits in a one-token step and in any verify pass by construction (the
    lean engine: order-fixed quantized products, native attention; a fixed-shape session: every pass the same
    shape): a greedy divergence cannot be a near-tie."""
    from specdec.fixed_shape import FixedShapeLM
    from specdec.gguf.lean import LeanLM

    return isinstance(target, (LeanLM, FixedShapeLM))


def baseline_or_speculative(k: int | None, target, draft, input_ids, max_new_tokens: int, **sampling) -> DecodeResult:
    """Our baseline (k None), or our speculative loop at k: one method of an interleaved turn (here and in peers.py).
    `sampling`: temperature, top_k, top_p, seed (none: greedy)."""
    if k is None:
        return generate_baseline(target, input_ids, max_new_tokens, **sampling)
    return generate_speculative(target, draft, input_ids, k, max_new_tokens, **sampling)


def run_decode_job(target, draft, prompts: pd.DataFrame, job: DecodeJob,
                   log: Callable[[str], None] = print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run the job over every prompt; returns (steps, sequences): one row per target pass, one per sequence."""
    return run_decode_jobs(target, draft, prompts, job, [job.k], log)[job.k]


def _summary(turn: Turn, ks: list[int], greedy: bool) -> str:
    base = turn.results[None]
    parts = [f"baseline {base.total_seconds:.2f}s"]
    for k in ks:
        spec = turn.results[k]
        identical = f", {'identical' if base.tokens == spec.tokens else 'DIFFERENT'} tokens" if greedy else ""
        parts.append(f"k{k} {spec.total_seconds:.2f}s ({base.total_seconds / spec.total_seconds:.2f}x, acceptance "
                     f"{spec.acceptance:.2f}, tokens/pass {spec.tokens_per_pass:.2f}{identical})")
    return ", ".join(parts)


def run_decode_jobs(target, draft, prompts: pd.DataFrame, job: DecodeJob, ks: list[int],
                    log: Callable[[str], None] = print) -> dict[int, tuple[pd.DataFrame, pd.DataFrame]]:
    """The job at several k in one process: per prompt and repeat the baseline and the speculative loop at each k
    run back to back in rotating order, so the baseline is timed once and each k's speedup is a ratio of timings
    taken within a minute. Returns, per k, (steps, sequences) as run_decode_job does for that k alone; the
    baseline's rows appear under every k."""
    step_rows = {k: [] for k in ks}
    sequence_rows = {k: [] for k in ks}
    job_keys = {k: {key: v for key, v in asdict(replace(job, k=k)).items() if key != "repeats"} for k in ks}
    greedy = job.setting == "greedy"
    sampling = dict(temperature=job.temperature, top_k=job.top_k, top_p=job.top_p, seed=job.seed)
    turns = run_interleaved(prompts, [None, *ks],  # None: the baseline
                            lambda k, input_ids, n: baseline_or_speculative(k, target, draft, input_ids, n, **sampling),
                            job.max_new_tokens, job.repeats, log, describe=lambda t: _summary(t, ks, greedy))
    for turn in turns:
        prompt, base = turn.prompt, turn.results[None]
        input_ids = prompt.input_ids
        for k in ks:
            spec = turn.results[k]
            identical = base.tokens == spec.tokens
            diagnosis = {}
            if greedy and not identical and _batch_invariant(target):
                # no rounding difference between the paths to explain it: any divergence is a bug, reported as one
                diagnosis = {"first_diff": first_difference(base.tokens, spec.tokens), "margin": float("nan"),
                             "path_diff": 0.0, "near_tie": False, "reproducible": None}
            elif greedy and not identical:
                diagnosis = diagnose_divergence(target, draft, batch_of_one(input_ids), k, job.max_new_tokens,
                                                base.tokens, spec.tokens)
                log(f"  divergence on {prompt.prompt_id} at k={k}: {diagnosis}")
            keys = dict(job_keys[k], prompt_id=prompt.prompt_id, repeat=turn.repeat)
            for method, result in (("baseline", base), ("speculative", spec)):
                step_rows[k] += [dict(keys, method=method, **step) for step in result.step_rows()]
                sequence_rows[k].append(dict(keys, method=method, n_prompt_tokens=len(input_ids),
                                             tokens=result.tokens, **result.summary(),
                                             identical=identical if method == "speculative" else None,
                                             **(diagnosis if method == "speculative" else {})))
    return {k: (pd.DataFrame(step_rows[k]), pd.DataFrame(sequence_rows[k])) for k in ks}
