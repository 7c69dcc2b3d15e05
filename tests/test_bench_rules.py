"""The bench stage (workflow/rules/bench.smk, its plan specdec/study/bench.py): the committed tables of bench/
scripts, each made by a rule that runs the script's own command line. Read off Snakemake dry runs of the real config
(no job runs, no model is needed): `bench` plans each regime's tables from the models, prompts and runs they read; a
table of the other regime is refused, naming the layer; the experiments' tables are planned by path; every planned
command is one the script's own argument parser accepts, with the values the committed table was made with."""

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import snakemake_runs
from scripts import load_script
from specdec.study import bench as bench_plan

REPO = Path(__file__).resolve().parents[1]
GGUF = ("--configfile", "config/gguf.yaml")
MACHINE = "a-test-machine"
TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
DOMAINS = ["code", "factual", "dialogue", "prose"]  # config.yaml's, in its order


def dry_run_test(test):
    """A dry run costs a few seconds (the Snakefile's imports): slow tier, one worker for the module's shared plans."""
    return pytest.mark.slow(pytest.mark.xdist_group("bench-plan")(test))


def dry_run(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    """`snakemake -n -p` in the checkout: every job of the DAG listed (--forceall) with its shell command."""
    result = snakemake_runs.run(["--dry-run", "--printshellcmds", "--forceall", "--nolock", "--cores", "2", *args],
                                cwd=REPO, env={**os.environ, "SPECDEC_MACHINE": MACHINE})
    if ok:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def planned_jobs(stdout: str) -> dict[str, list[dict]]:
    """rule -> its jobs, each {"input": [...], "output": [...], "log": [...], "shell": the command}."""
    jobs, job = {}, None
    for line in stdout.splitlines():
        started = re.match(r"(?:local)?rule (\w+):$", line)
        if started:
            job = {"input": [], "output": [], "log": [], "shell": None}
            jobs.setdefault(started.group(1), []).append(job)
        elif job is not None and line.startswith("Shell command: "):
            job["shell"] = line.removeprefix("Shell command: ")
        elif job is not None and re.match(r"    (input|output|log): ", line):
            key, value = line.strip().split(": ", 1)
            job[key] = value.split(", ")
    return jobs


def bench_jobs(jobs: dict) -> dict[str, dict]:
    """The bench_* rules' jobs by their first output."""
    return {job["output"][0]: dict(job, rule=rule) for rule, rule_jobs in jobs.items() if rule.startswith("bench_")
            for job in rule_jobs}


def script_arguments(shell: str) -> tuple[str, argparse.Namespace]:
    """(the script, the arguments its own parser reads from the command): the script's main() is run up to its
    parse_args and stopped there, so no model loads."""

    class Parsed(Exception):
        pass

    words = shlex.split(shell)
    words = words[:words.index(">")]  # the log redirection
    assert words[0] == "python" and words[1].startswith("bench/"), shell
    module = load_script(words[1], f"bench_cli_{Path(words[1]).stem}")
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(parser, args=None, namespace=None):
        raise Parsed(original(parser, args, namespace))

    argv = sys.argv
    try:
        sys.argv, argparse.ArgumentParser.parse_args = words[1:], parse_and_stop
        with pytest.raises(Parsed) as parsed:
            module.main()
    finally:
        sys.argv, argparse.ArgumentParser.parse_args = argv, original
    return words[1], parsed.value.args[0]


@pytest.fixture(scope="module")
def fp32_plan() -> dict:
    return planned_jobs(dry_run("bench").stdout)


@pytest.fixture(scope="module")
def gguf_plan() -> dict:
    return planned_jobs(dry_run(*GGUF, "--", "bench").stdout)


# --- the plan itself (fast) -----------------------------------------------------------------------------------
def test_each_regime_has_its_own_bench_tables():
    assert bench_plan.study_tables("results/study", gguf=False) == [
        "results/study/tables/batch_invariance.csv", "results/study/tables/draft_dtype_ab.csv"]
    assert bench_plan.study_tables("results/study-gguf", gguf=True) == [
        "results/study-gguf/tables/batch_invariance.csv", "results/study-gguf/tables/same_model.csv",
        "results/study-gguf/tables/llamacpp_agreement.csv"]


def test_a_rule_of_one_regime_is_refused_in_the_other_naming_the_layer():
    gguf_rule = bench_plan.only_in("gguf", gguf=False, what="bench_same_model")
    with pytest.raises(bench_plan.BenchPlanError, match=r"bench_same_model is a table of the gguf regime: .*"
                                                     r"--configfile config/gguf\.yaml"):
        gguf_rule(None)
    fp32_rule = bench_plan.only_in("fp32", gguf=True, what="bench_draft_dtype_ab")
    with pytest.raises(bench_plan.BenchPlanError, match="bench_draft_dtype_ab is a table of the fp32 regime"):
        fp32_rule(None)
    # in their own regime they add no input
    assert bench_plan.only_in("gguf", gguf=True, what="x")(None) == {}
    assert bench_plan.only_in("fp32", gguf=False, what="x")(None) == {}
    with pytest.raises(ValueError, match="regime 'bf16'"):
        bench_plan.only_in("bf16", gguf=False, what="x")


def test_the_ab_rules_name_their_draft_model_where_the_config_lacks_it():
    assert bench_plan.draft_model({DRAFT: {}, TARGET: {}}) == DRAFT
    with pytest.raises(bench_plan.BenchPlanError, match=f"draft model '{DRAFT}', which config key 'models' does"):
        bench_plan.draft_model({"tiny-target": {}})


def test_the_kernel_ab_runs_each_domain_as_committed():
    """Code: 10 prompts and the lookup and hybrid drafts too; the other domains 5 prompts, the model draft."""
    assert bench_plan.kernel_ab_setting("prompts", "code") == 10
    assert bench_plan.kernel_ab_setting("drafts", "code") == ["model:2", "model:4", "lookup:4", "hybrid:4"]
    assert bench_plan.kernel_ab_setting("prompts", "prose") == 5
    assert bench_plan.kernel_ab_setting("drafts", "dialogue") == ["model:2", "model:4"]


# --- dry runs of the real config (slow) ------------------------------------------------------------------------
@dry_run_test
def test_bench_plans_the_studys_tables_in_fp32_from_the_models_and_prompts(fp32_plan):
    jobs = bench_jobs(fp32_plan)
    assert set(jobs) == {"results/study/tables/batch_invariance.csv", "results/study/tables/draft_dtype_ab.csv"}
    assert set(fp32_plan["bench"][0]["input"]) == set(jobs)
    invariance = jobs["results/study/tables/batch_invariance.csv"]
    assert invariance["rule"] == "bench_batch_invariance"
    assert set(invariance["input"]) == {f"resources/models/{TARGET}",
                                        *(f"results/study/prompts/{d}.parquet" for d in DOMAINS)}
    assert invariance["log"] == ["logs/results/study/bench/batch_invariance.log"]
    ab = jobs["results/study/tables/draft_dtype_ab.csv"]
    assert ab["rule"] == "bench_draft_dtype_ab"
    assert ab["output"] == ["results/study/tables/draft_dtype_ab.csv", "results/study/tables/draft_dtype_ab.runs.csv"]
    assert set(ab["input"]) == {f"resources/models/{TARGET}", f"resources/models/{DRAFT}",
                                "results/study/prompts/code.parquet"}
    # Snakemake makes what they read first: the models and the prompts
    assert {job["output"][0] for job in fp32_plan["prepare_model"]} == {f"resources/models/{TARGET}",
                                                                        f"resources/models/{DRAFT}"}
    assert len(fp32_plan["make_prompts"]) == 4


@dry_run_test
def test_bench_plans_the_gguf_regimes_tables_from_the_files_and_the_side_by_side_runs(gguf_plan):
    jobs = bench_jobs(gguf_plan)
    assert set(jobs) == {f"results/study-gguf/tables/{name}.csv"
                         for name in ("batch_invariance", "same_model", "llamacpp_agreement")}
    assert set(gguf_plan["bench"][0]["input"]) == set(jobs)
    prompts = {f"results/study-gguf/prompts/{d}.parquet" for d in DOMAINS}
    invariance = jobs["results/study-gguf/tables/batch_invariance.csv"]
    assert set(invariance["input"]) == {f"resources/gguf/{TARGET}.gguf", *prompts}  # no fp32 weights
    same = jobs["results/study-gguf/tables/same_model.csv"]
    assert same["rule"] == "bench_same_model"
    assert set(same["input"]) == {f"resources/models/{TARGET}", f"resources/gguf/{TARGET}.gguf", *prompts}
    agreement = jobs["results/study-gguf/tables/llamacpp_agreement.csv"]
    assert set(agreement["input"]) == {f"resources/gguf/{TARGET}.tokenizer",
                                       *(f"results/study-gguf/vs_llamacpp/runs/{d}.parquet" for d in DOMAINS)}
    assert {job["output"][0] for job in gguf_plan["vs_llamacpp_run"]} == {
        f"results/study-gguf/vs_llamacpp/runs/{d}.parquet" for d in DOMAINS}  # the side-by-side runs first
    assert "bench_draft_dtype_ab" not in gguf_plan


@dry_run_test
def test_every_planned_command_is_one_its_script_reads_with_the_committed_settings(fp32_plan, gguf_plan):
    commands = {output: script_arguments(job["shell"]) for plan in (fp32_plan, gguf_plan)
                for output, job in bench_jobs(plan).items()}
    script, args = commands["results/study/tables/batch_invariance.csv"]
    assert script == "bench/batch_invariance.py" and args.gguf is None
    assert (args.model, args.kernels, args.prompts, args.tokens, args.m) == (
        f"resources/models/{TARGET}", ["invariant", "auto"], 2, 24, [2, 5, 9, 16])
    assert (args.prompts_dir, args.domains, args.threads) == ("results/study/prompts", DOMAINS, 2)
    script, args = commands["results/study-gguf/tables/batch_invariance.csv"]
    assert (args.gguf, args.kernels, args.prompts, args.tokens, args.m, args.prompts_dir) == (
        f"resources/gguf/{TARGET}.gguf", None, 3, 32, [2, 3, 5, 9, 16], "results/study-gguf/prompts")
    script, args = commands["results/study/tables/draft_dtype_ab.csv"]
    assert script == "bench/draft_ab.py"
    assert (args.target, args.draft, args.prompts, args.count, args.k, args.variants, args.kind) == (
        f"resources/models/{TARGET}", f"resources/models/{DRAFT}", ["results/study/prompts/code.parquet"], 3,
        [4, 8], ["float32", "bfloat16"], "model")
    assert args.out == "results/study/tables/draft_dtype_ab.csv"
    script, args = commands["results/study-gguf/tables/same_model.csv"]
    assert (script, args.model, args.prompts_dir, args.prompts, args.tokens, args.out) == (
        "bench/same_model.py", TARGET, "results/study-gguf/prompts", 5, 32, "results/study-gguf/tables/same_model.csv")
    script, args = commands["results/study-gguf/tables/llamacpp_agreement.csv"]
    assert (script, args.runs, args.tokenizer, args.out) == (
        "bench/llamacpp_agreement.py", "results/study-gguf/vs_llamacpp/runs", f"resources/gguf/{TARGET}.tokenizer",
        "results/study-gguf/tables/llamacpp_agreement.csv")


@dry_run_test
def test_a_gguf_table_is_refused_in_the_fp32_regime_naming_the_layer():
    result = dry_run("--", "results/study/tables/same_model.csv", ok=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert ("bench_same_model (the GGUF engine against the fp32 one) is a table of the gguf regime: run it with "
            "runtime.weights 'gguf' (--configfile config/gguf.yaml)") in output, output[-3000:]


@dry_run_test
def test_an_fp32_table_is_refused_in_the_gguf_regime():
    result = dry_run(*GGUF, "--", "results/study-gguf/tables/draft_dtype_ab.csv", ok=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "bench_draft_dtype_ab" in output
    assert "is a table of the fp32 regime" in output, output[-3000:]


@dry_run_test
def test_the_feature_head_experiment_plans_the_head_cost_by_path():
    results = f"results/experiments/feature-head/{MACHINE}/tables/feature_head_cost.csv"
    plan = planned_jobs(dry_run("--configfile", "config/heads.yaml", "experiments/feature-head/config.yaml", "--",
                                results).stdout)
    job = bench_jobs(plan)[results]
    assert job["rule"] == "bench_feature_head_cost"
    assert set(job["input"]) == {f"resources/models/{TARGET}", f"resources/gguf/{TARGET}.gguf"}
    script, args = script_arguments(job["shell"])
    assert (script, args.model, args.vocab, args.dtypes, args.rounds, args.out) == (
        "bench/feature_head_cost.py", TARGET, [32768, 8192], ["float32", "bfloat16"], 30, results)


@dry_run_test
def test_the_amx_experiment_plans_the_kernel_ab_per_domain_by_path():
    tables = f"results/experiments/vs-llamacpp-amx/{MACHINE}/tables"
    plan = planned_jobs(dry_run(*GGUF, "experiments/llamacpp-no-repack/config.yaml",
                                "experiments/vs-llamacpp-amx/config.yaml", "--",
                                f"{tables}/kernel_ab_code.csv", f"{tables}/kernel_ab_prose.csv").stdout)
    jobs = bench_jobs(plan)
    assert set(jobs) == {f"{tables}/kernel_ab_code.csv", f"{tables}/kernel_ab_prose.csv"}
    code = jobs[f"{tables}/kernel_ab_code.csv"]
    assert code["output"] == [f"{tables}/kernel_ab_code.csv", f"{tables}/kernel_ab_code.runs.csv",
                              f"{tables}/kernel_ab_code.provenance.yaml"]  # what the script writes beside it
    assert set(code["input"]) == {f"resources/gguf/{TARGET}.gguf", f"resources/gguf/{DRAFT}.gguf",
                                  f"results/experiments/vs-llamacpp-amx/{MACHINE}/prompts/code.parquet"}
    _, args = script_arguments(code["shell"])
    assert (args.count, args.drafts, args.kernels, args.max_new_tokens) == (
        10, [("model", 2), ("model", 4), ("lookup", 4), ("hybrid", 4)], ["avx512-vnni", "amx"], 128)
    _, args = script_arguments(jobs[f"{tables}/kernel_ab_prose.csv"]["shell"])
    assert (args.count, args.drafts) == (5, [("model", 2), ("model", 4)])


@dry_run_test
def test_the_default_target_plans_no_bench_rule():
    plan = planned_jobs(dry_run().stdout)
    assert "all" in plan and "decode" in plan, sorted(plan)  # the study's plan was read
    assert [rule for rule in plan if rule.startswith("bench")] == []
