"""One decoding job of the study: baseline and speculative decoding over a prompt set, interleaved in one process.

Per prompt and repeat the two methods run back to back, their order alternating, so that slow drifts of a shared
machine hit both alike; speedups are then ratios of timings taken seconds apart. Greedy runs are compared token for
token on the spot and any divergence is diagnosed while the models are loaded (see diagnose.py).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Callable

import pandas as pd
import torch

from .decode import DecodeResult, generate_baseline, generate_speculative
from .diagnose import diagnose_divergence
from .draft_kinds import EarlyExitDraft, PromptLookupDraft
from .drafts import ModelDraft
from .interleave import batch_of_one, run_in_rotation
from .kernels import use_row_adaptive_bf16_linear, use_weight_major_linear
from .lm import eos_ids_of, vocab_size_of
from .models import check_same_vocabulary, load_model

# Draft kinds a study can name. 'model', 'truncated' and 'distilled' load a prepared model directory (the workflow
# derives truncated ones and trains distilled ones); the others are built from the target itself.
DRAFT_KINDS = ("model", "truncated", "distilled", "prompt_lookup", "early_exit")


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


@dataclass(frozen=True)
class Runtime:
    dtype: str = "float32"
    device: str = "cpu"
    linear_kernel: str = "weight_major"
    threads: int | None = None


def load_for_decoding(model_dir, runtime: Runtime):
    """A prepared model set up as the study runs it (dtype, device, linear kernel); returns (model, tokenizer)."""
    if runtime.threads:
        torch.set_num_threads(runtime.threads)
    if runtime.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("config runtime.device is 'cuda' but torch sees no CUDA device")
    model, tokenizer = load_model(model_dir, dtype=runtime.dtype, device=runtime.device)
    # Weight-major pays off for fp32 only: torch's bf16 products of 2-9 rows are faster as shipped; bf16 products
    # of many rows (a prompt pass) run on an fp32 copy instead (README, Performance).
    if runtime.linear_kernel == "weight_major" and runtime.device == "cpu":
        if runtime.dtype == "float32":
            use_weight_major_linear(model)
        elif runtime.dtype == "bfloat16":
            use_row_adaptive_bf16_linear(model)
    return model, tokenizer


def draft_runtime(spec: dict, runtime: Runtime) -> Runtime:
    """The runtime a draft model loads with: the study's, in the draft's own dtype where its spec names one. The
    draft's precision never touches exactness (the rule uses the q the draft actually computed), only its speed
    and acceptance."""
    return replace(runtime, dtype=spec.get("dtype") or runtime.dtype)


def load_draft_model(name: str, spec: dict, draft_dir, target_tokenizer, runtime: Runtime):
    """A draft's prepared model, loaded in its runtime; its tokenizer must equal the target's."""
    if not draft_dir:
        raise ValueError(f"draft {name!r} of kind {spec.get('kind', 'model')!r} needs a prepared model directory")
    model, tokenizer = load_for_decoding(draft_dir, draft_runtime(spec, runtime))
    check_same_vocabulary(target_tokenizer, tokenizer, "target", name)
    return model


def make_draft(name: str, spec: dict, target, target_tokenizer, draft_dir, runtime: Runtime):
    """The draft proposer a study's draft spec asks for; a model draft's tokenizer must equal the target's."""
    kind = spec.get("kind", "model")
    min_confidence = spec.get("min_confidence")
    if kind in ("model", "truncated", "distilled"):
        model = load_draft_model(name, spec, draft_dir, target_tokenizer, runtime)
        return ModelDraft(model, min_confidence=min_confidence)
    if kind == "prompt_lookup":
        return PromptLookupDraft(vocab_size_of(target), spec.get("ngram_max", 3), spec.get("ngram_min", 1),
                                 eos_token_ids=sorted(eos_ids_of(target)))
    if kind == "early_exit":
        return EarlyExitDraft(target, int(spec["layers"]), min_confidence=min_confidence)
    raise ValueError(f"draft {name!r}: unknown kind {kind!r} (known: {', '.join(DRAFT_KINDS)})")


def _run(k: int | None, target, draft, input_ids, job: DecodeJob) -> DecodeResult:
    """The baseline (k None), or the speculative loop at k."""
    sampling = dict(temperature=job.temperature, top_k=job.top_k, top_p=job.top_p, seed=job.seed)
    if k is None:
        return generate_baseline(target, input_ids, job.max_new_tokens, **sampling)
    return generate_speculative(target, draft, input_ids, k, job.max_new_tokens, **sampling)


def run_decode_job(target, draft, prompts: pd.DataFrame, job: DecodeJob,
                   log: Callable[[str], None] = print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run the job over every prompt; returns (steps, sequences): one row per target pass, one per sequence."""
    return run_decode_jobs(target, draft, prompts, job, [job.k], log)[job.k]


def run_decode_jobs(target, draft, prompts: pd.DataFrame, job: DecodeJob, ks: list[int],
                    log: Callable[[str], None] = print) -> dict[int, tuple[pd.DataFrame, pd.DataFrame]]:
    """The job at several k in one process: per prompt and repeat the baseline and the speculative loop at each k
    run back to back in rotating order, so the baseline is timed once and each k's speedup is a ratio of timings
    taken within a minute. Returns, per k, (steps, sequences) as run_decode_job does for that k alone; the
    baseline's rows appear under every k."""
    methods = [None, *ks]  # None: the baseline
    step_rows = {k: [] for k in ks}
    sequence_rows = {k: [] for k in ks}
    job_keys = {k: {key: v for key, v in asdict(replace(job, k=k)).items() if key != "repeats"} for k in ks}
    # Warm-up (first calls allocate and pick kernels): not recorded.
    warm = batch_of_one(prompts.iloc[0]["input_ids"])
    generate_baseline(target, warm, 2)
    for k in ks:
        generate_speculative(target, draft, warm, k, 2)
    started = time.perf_counter()
    for index, prompt in enumerate(prompts.itertuples(index=False)):
        input_ids = batch_of_one(prompt.input_ids)
        for repeat in range(job.repeats):
            results = run_in_rotation(methods, index + repeat, lambda k: _run(k, target, draft, input_ids, job))
            base = results[None]
            summaries = []
            for k in ks:
                spec = results[k]
                identical = base.tokens == spec.tokens
                diagnosis = {}
                if job.setting == "greedy" and not identical:
                    diagnosis = diagnose_divergence(target, draft, input_ids, k, job.max_new_tokens,
                                                    base.tokens, spec.tokens)
                    log(f"  divergence on {prompt.prompt_id} at k={k}: {diagnosis}")
                keys = dict(job_keys[k], prompt_id=prompt.prompt_id, repeat=repeat)
                for method, result in (("baseline", base), ("speculative", spec)):
                    step_rows[k] += [dict(keys, method=method, **step) for step in result.step_rows()]
                    sequence_rows[k].append(dict(keys, method=method, n_prompt_tokens=len(prompt.input_ids),
                                                 tokens=result.tokens, **result.summary(),
                                                 identical=identical if method == "speculative" else None,
                                                 **(diagnosis if method == "speculative" else {})))
                summaries.append(f"k{k} {spec.total_seconds:.2f}s ({base.total_seconds / spec.total_seconds:.2f}x, "
                                 f"acceptance {spec.acceptance:.2f}, tokens/pass {spec.tokens_per_pass:.2f}"
                                 + (f", {'identical' if identical else 'DIFFERENT'} tokens" if job.setting == "greedy"
                                    else "") + ")")
            log(f"[{index + 1}/{len(prompts)} r{repeat}] {prompt.prompt_id}: baseline {base.total_seconds:.2f}s, "
                + ", ".join(summaries) + f"; {time.perf_counter() - started:.0f}s so far")
    return {k: (pd.DataFrame(step_rows[k]), pd.DataFrame(sequence_rows[k])) for k in ks}
