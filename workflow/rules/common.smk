# The run's globals: the validated config's sections, the machine and where the run writes, the wildcards' patterns,
# and the plan's functions under the names the rules call. What is planned (which jobs, files, weights) is decided in
# specdec/study/plan/ (StudyPlan: plain functions of the config and the run's paths, tested in tests/test_plan.py).
import functools
import glob  # glob, os and Path: for the rules too
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from specdec.native.build import kernel_build, stale_native_modules
from specdec.study.config import validate_config
from specdec.study.machine import machine_id
from specdec.study.plan import PlanError, StudyPlan, TIMED_KERNELS, gguf_file, gguf_tokenizer_dir, model_dir, one_of
from specdec.study.prepare.prompts import source_file_name


validate_config(config, SCHEMA)

DECODING = config["decoding"]
RUNTIME = config["runtime"]
PROFILING = config.get("profiling") or {}
DISTRIBUTION = config.get("distribution_check") or None
PEERS = config.get("peers") or None
SWEEP = config.get("draft_sweep") or {}
REPRODUCE = config.get("reproduce") or {}
DISTILLATION = config.get("distillation") or {}
# Where training prompts come from (default: the evaluation domains' sources, minus the evaluation prompts).
TRAINING_DOMAINS = DISTILLATION.get("domains") or config["domains"]
PLUGINS = config.get("plugins") or []
# Torch threads of every timed job, and part of the machine id: runtime.threads, whatever --cores is, so that
# `--cores 1` reuses the tables and fits of `--cores 2`. Rules declare it as their threads so Snakemake runs a timed
# job alone (it caps a job's declared threads at --cores, which bounds only how many jobs run at once); the job
# scripts read runtime.threads, not snakemake.threads.
THREADS = RUNTIME["threads"]
if isinstance(workflow.cores, int) and workflow.cores < THREADS:
    print(f"specdec: --cores {workflow.cores} < runtime.threads {THREADS}: timed jobs run {THREADS} torch threads "
          "(runtime.threads) one at a time; --cores bounds how many jobs run at once", file=sys.stderr)
# runtime.weights: "safetensors" (prepared model directories, fp32/bf16) or "gguf" (each model from its GGUF file,
# resources/gguf/{model}.gguf, on the lean engine; config/gguf.yaml). The rules that run Hugging Face models refuse
# to be scheduled in the gguf regime (fp32_only).
GGUF = RUNTIME["weights"] == "gguf"
# The cost model (the machine's profiles and fit, and its audit of the study's greedy decode runs) runs in both
# regimes; in the gguf regime each GGUF file's lean session is profiled per layer inside the fused call.
COSTMODEL_IN_STUDY = bool(PROFILING)

# Kernel tables are keyed by the native kernels' build (a hash of their sources and compile flags): an edited or
# rebuilt kernel is timed again, and every profile and run that reads the tables is redone after it.
if stale_native_modules():
    raise WorkflowError(f"specdec's native module(s) {stale_native_modules()} were built from another version of "
                        "their source (an editable install does not rebuild them): run `pip install -e .` again")
# Profiles and fits are kept per machine and engine kernel: a run on another machine adds its own directory.
# SPECDEC_MACHINE names the machine instead (e.g. a cluster's node type, or a test's second machine). On a GPU
# (runtime.device cuda) the GPU is the machine (its name, CUDA, torch).
try:
    MACHINE = os.environ.get("SPECDEC_MACHINE") or machine_id(threads=THREADS, device=RUNTIME["device"])
except RuntimeError as e:  # runtime.device cuda where torch sees no GPU
    raise WorkflowError(f"config key 'runtime.device': {e} (SPECDEC_MACHINE=<gpu id> plans the DAG without one)")
PLAN = StudyPlan.for_run(config, machine=MACHINE, kernel_build=kernel_build())
# Where a run writes (RunPaths): its results_dir ("{machine}" in it: the machine id, one directory per CPU type),
# logs/<results_dir>/ and benchmarks/<results_dir>/, so runs never overwrite each other; models and downloads
# (resources/) are shared. Profiles and fits: machines_dir/<machine>/<linear_kernel, or gguf>.
R, LOG, BENCH, MACHINE_DIR = PLAN.paths.results, PLAN.paths.logs, PLAN.paths.benchmarks, PLAN.paths.machine_dir
SWEEP_K = PLAN.sweep_k
EVALUATION_SELECTION = PLAN.evaluation_selection()
LLAMACPP, LLAMACPP_DIR, LLAMACPP_SDIST = PLAN.llamacpp, PLAN.llamacpp_dir, PLAN.llamacpp_sdist
LLAMACPP_BUILD = PLAN.llamacpp_build
VS_LLAMACPP = PLAN.vs_llamacpp

wildcard_constraints:
    model=one_of(config["models"], "no-model"),
    # Any defined draft (a draft kind or a plain model): the study runs those under `drafts`; the sweep, peers and
    # the distribution check may name others.
    draft=one_of(dict.fromkeys([*config["drafts"], *config.get("draft_kinds", {}), *config["models"]]), "no-draft"),
    derived=one_of(PLAN.drafts_made_by("truncate"), "no-truncated-draft"),
    distilled=one_of(PLAN.drafts_made_by("distill"), "no-distilled-draft"),
    domain=one_of(config["domains"], "no-domain"),
    setting="greedy|sampled",
    profiled=one_of([*config["models"], *PLAN.drafts_made_by("truncate"), *PLAN.drafts_made_by("distill")],
                    "no-model"),
    k=r"\d+",
    seed=r"\d+",


def workflow_error(function):
    """`function` with the plan's refusals (PlanError) raised as WorkflowError: Snakemake reports the message."""

    @functools.wraps(function)
    def call(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except PlanError as e:
            raise WorkflowError(str(e)) from None

    return call


def fp32_only(what):
    """An input function for the rules that run Hugging Face models; in the gguf regime, asking for their outputs
    is an error naming the stage `what`."""
    return workflow_error(lambda wildcards: PLAN.fp32_only(what))


# The plan's functions under the names the rules call (each documented in specdec/study/plan/); the input functions
# (taking wildcards) pass the plan the wildcard they need.
draft_model_input = lambda wildcards: PLAN.draft_model_input(wildcards.draft)
kernel_inputs = lambda wildcards: PLAN.kernel_inputs(getattr(wildcards, "draft", None))
profiled_kernel_input = lambda wildcards: PLAN.profiled_kernel_input(wildcards.profiled)
sampling_params = lambda wildcards: PLAN.sampling_params(wildcards.setting)
prompt_inputs = lambda wildcards: PLAN.prompt_inputs(wildcards.domain)
distill_training = lambda wildcards: PLAN.distill_training(wildcards.distilled)
llamacpp_export_inputs = lambda wildcards: PLAN.llamacpp_export_inputs(wildcards.exported)
llamacpp_gguf_inputs = lambda wildcards=None: PLAN.llamacpp_gguf_inputs()
vs_llamacpp_inputs = workflow_error(lambda wildcards: PLAN.vs_llamacpp_inputs())
profiled_source = workflow_error(PLAN.profiled_source)
# drafts, weights and prompts
draft_spec, drafts_made_by, target_input = PLAN.draft_spec, PLAN.drafts_made_by, PLAN.target_input
study_model_dirs, gguf_models = PLAN.study_model_dirs, PLAN.gguf_models
prompt_source_file, prompt_source_files, prompt_sources_of = (PLAN.prompt_source_file, PLAN.prompt_source_files,
                                                              PLAN.prompt_sources_of)
training_prompt_inputs, training_prompt_sources = PLAN.training_prompt_inputs, PLAN.training_prompt_sources
# decoding, the distribution check, the sweep, peers and reproduce
decode_jobs, run_files = PLAN.decode_jobs, PLAN.run_files
distribution_drafts, distribution_files = PLAN.distribution_drafts, PLAN.distribution_files
sweep_drafts, sweep_setting, sweep_run_files = PLAN.sweep_drafts, PLAN.sweep_setting, PLAN.sweep_run_files
sweep_model_files, sweep_benchmark_files = PLAN.sweep_model_files, PLAN.sweep_benchmark_files
peers_files, reproduce_cells = PLAN.peers_files, PLAN.reproduce_cells
# the cost model
profiled_models, profile_files, kernel_table = PLAN.profiled_models, PLAN.profile_files, PLAN.kernel_table
head_profiles, head_profile_files = PLAN.head_profiles, PLAN.head_profile_files
study_kernel_tables, measured_machine_dirs = PLAN.study_kernel_tables, PLAN.measured_machine_dirs
machine_fit_files, machine_fit_drafts = PLAN.machine_fit_files, PLAN.machine_fit_drafts
# llama.cpp
llamacpp_exported_kinds, llamacpp_drafts, llamacpp_k = (PLAN.llamacpp_exported_kinds, PLAN.llamacpp_drafts,
                                                        PLAN.llamacpp_k)
llamacpp_run_files, llamacpp_engine_files = PLAN.llamacpp_run_files, PLAN.llamacpp_engine_files
vs_llamacpp_prompts, vs_llamacpp_gguf_files = PLAN.vs_llamacpp_prompts, PLAN.vs_llamacpp_gguf_files

# the gguf regime: every draft the run may decode runs there, every GGUF file it reads exists or is made; at start
if GGUF:
    workflow_error(PLAN.check_gguf_regime)()
