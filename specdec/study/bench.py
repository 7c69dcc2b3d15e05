"""The bench stage's plan (workflow/rules/bench.smk): which committed tables of the bench/ scripts a run's regime
makes, the settings each was made with, and the refusal of a table asked for in the other regime.

No timing or model here: the rules run the scripts' own command lines (bench/README.md)."""

from __future__ import annotations

from typing import Callable

from specdec.study.plan import PlanError

# The tables the `bench` target makes, by regime (runtime.weights gguf or not), under the run's results_dir/tables/.
# The experiments' tables (feature_head_cost, kernel_ab_{domain}) are asked for by path.
STUDY_TABLES = {"fp32": ["batch_invariance.csv", "draft_dtype_ab.csv"],
                "gguf": ["batch_invariance.csv", "same_model.csv", "llamacpp_agreement.csv"]}
# The draft model of the dtype A/B (its prepared directory) and of the kernel A/B (its GGUF file): the 0.5B draft.
DRAFT_MODEL = "qwen2.5-coder-0.5b-instruct"
# Logits of a one-token step against passes of m positions: fp32 on the invariant and auto linear kernels
# (docs/performance.md); gguf on every product kernel this CPU runs, the script's default (docs/quantized.md).
BATCH_INVARIANCE = {"fp32": {"kernels": ["invariant", "auto"], "prompts": 2, "tokens": 24, "m": [2, 5, 9, 16]},
                    "gguf": {"kernels": [], "prompts": 3, "tokens": 32, "m": [2, 3, 5, 9, 16]}}
# The kernel A/B as committed (experiments/vs-llamacpp-amx, docs/quantized.md "AMX tiles"): per domain (else
# `default`) its prompts and KIND:K drafts, on the two AVX-512 product kernels (a CPU without AMX tiles is refused
# by the script, naming the kernel).
KERNEL_AB = {"prompts": {"code": 10, "default": 5},
             "drafts": {"code": ["model:2", "model:4", "lookup:4", "hybrid:4"], "default": ["model:2", "model:4"]},
             "kernels": ["avx512-vnni", "amx"], "max_new_tokens": 128}


class BenchPlanError(PlanError):
    """A bench table that cannot be planned: asked for in the regime it is not made in, or its model undefined (a
    plan's refusal: the workflow reports it as every other, workflow_error)."""


def regime(gguf: bool) -> str:
    return "gguf" if gguf else "fp32"


def study_tables(results_dir: str, gguf: bool) -> list[str]:
    """The `bench` target's files: the committed bench tables of this regime's run."""
    return [f"{results_dir}/tables/{name}" for name in STUDY_TABLES[regime(gguf)]]


def only_in(wanted: str, gguf: bool, what: str) -> Callable[[object], dict]:
    """An input function (no inputs of its own) that refuses, naming `what` and the layer to run it with, a job of a
    rule made only in regime `wanted` ("fp32" or "gguf") when the run is in the other."""
    if wanted not in STUDY_TABLES:
        raise ValueError(f"regime {wanted!r}: one of {', '.join(STUDY_TABLES)}")

    def refuse(wildcards) -> dict:
        if regime(gguf) != wanted:
            how = ("with runtime.weights 'gguf' (--configfile config/gguf.yaml)" if wanted == "gguf"
                   else "without runtime.weights 'gguf' (the study's config.yaml, no config/gguf.yaml)")
            raise BenchPlanError(f"{what} is a table of the {wanted} regime: run it {how}")
        return {}

    return refuse


def draft_model(models) -> str:
    """DRAFT_MODEL, refused by name where the config's `models` do not define it (the A/B rules' jobs ask for it)."""
    if DRAFT_MODEL not in models:
        raise BenchPlanError(f"the bench A/B rules run the draft model {DRAFT_MODEL!r}, which config key 'models' "
                             "does not define")
    return DRAFT_MODEL


def kernel_ab_setting(key: str, domain: str):
    """KERNEL_AB's `key` ("prompts", "drafts") for one domain: its own, else the default."""
    setting = KERNEL_AB[key]
    return setting.get(domain, setting["default"])
