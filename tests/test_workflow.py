"""The Snakemake workflow on a tiny study: the whole DAG runs, caching schedules only what changed, bad configs are
refused with the offending key named."""

import copy
import hashlib
import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

import snakemake_runs
from specdec.study.config import ConfigError, validate_config
from specdec.testing import build_tiny_study

# Tests on the shared tiny study run on one xdist worker (ON_TINY_STUDY, so its module fixture is built once); the
# others, each with a workdir of its own, spread over the workers.
pytestmark = pytest.mark.slow
ON_TINY_STUDY = pytest.mark.xdist_group("tiny-study")

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow/schemas/config.schema.yaml"


# tests/ on the workflow's PYTHONPATH: the tiny study's `plugins` (toy_draft, gated_draft) live there
PLUGIN_PATH = {"PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}


def snakemake(workdir: Path, *args: str, configfile: Path | None = None,
              env: dict | None = None) -> subprocess.CompletedProcess:
    return snakemake_runs.run(["--snakefile", REPO / "Snakefile", "--directory", workdir,
                               "--configfile", configfile or workdir / "config.yaml", *args],
                              env=dict(os.environ, OMP_NUM_THREADS="1", **{**PLUGIN_PATH, **(env or {})}), timeout=900)


# Full tiny runs use both cores: every multi-threaded rule gets one thread, so Snakemake runs two jobs at a time
# (tiny jobs are mostly interpreter start-up). The interruption test keeps --cores 1: it needs one job at a time.
THREADED_RULES = ["decode", "reproduce_decode", "sweep_decode", "peers_run", "verify_distribution", "profile_model",
                  "profile_fit_models", "measure_bandwidth", "distill_data", "distill_draft"]
TWO_JOBS_AT_A_TIME = ("--cores", "2", "--set-threads", *[f"{rule}=1" for rule in THREADED_RULES])


def job_counts(dry_run_output: str) -> dict[str, int]:
    """Parse the 'Job stats' table of a dry run; {} when there is nothing to be done."""
    lines = dry_run_output.splitlines()
    if "Job stats:" not in lines:
        return {}
    counts = {}
    for line in lines[lines.index("Job stats:") + 3:]:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


ALL_DRAFT_KINDS = {
    "lookup": {"kind": "prompt_lookup", "ngram_max": 3},
    "early1": {"kind": "early_exit", "layers": 1},
    "trunc1": {"kind": "truncated", "model": "tiny-draft0", "layers": 1},
    "adaptive": {"kind": "model", "model": "tiny-draft0", "min_confidence": 0.5},
    "dist1": {"kind": "distilled", "model": "tiny-draft0", "layers": 1,
              "training": {"steps": 3, "batch_size": 1, "checkpoint_every": 2}},
    "head1": {"kind": "feature_head", "vocab": 48,
              "training": {"steps": 3, "batch_size": 1, "checkpoint_every": 2, "warmup": 1}},
}


def tiny_config(root: Path) -> dict:
    """One domain, k = 2, greedy and one sampled seed, a model draft plus one draft of every other kind (sampled:
    a model draft and a draft without a model, enough for the DAG; every kind's law is checked in test_registry)."""
    config = build_tiny_study(root, k=[2], drafts=2)
    config["domains"] = {"code": config["domains"]["code"]}
    config["decoding"]["sampled"]["k"] = [2]
    config["decoding"]["sampled"]["drafts"] = ["tiny-draft0", "lookup"]
    config["distribution_check"]["drafts"] = ["adaptive"]  # a model draft, adaptive: the rule's hardest case
    # the toy kind of tests/toy_draft.py: a kind defined outside specdec, through `plugins`
    config["drafts"] = ["tiny-draft0", *ALL_DRAFT_KINDS, "toy"]  # tiny-draft1 is added by a test below
    config["plugins"] = ["toy_draft"]
    # Defined but not studied: peers may still name it (and so runs its model in bf16 next to the fp32 target).
    config["draft_kinds"] = dict(ALL_DRAFT_KINDS, toy={"kind": "repeat_last", "times": 2},
                                 bf16={"kind": "model", "model": "tiny-draft0", "dtype": "bfloat16"})
    config["peers"]["drafts"] = ["bf16"]
    # The draft sweep: every k in one job per (draft, domain); bf16 is defined but not studied, lookup is both.
    config["draft_sweep"] = {"drafts": ["bf16", "lookup"], "k": [1, 2], "prompts_per_domain": 1}
    write_config(root / "config.yaml", config)
    return config


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-study")
    config = tiny_config(root)
    # The study (the default target) and the draft sweep, a named target outside it (peers: see the tests below).
    result = snakemake(root, *TWO_JOBS_AT_A_TIME, "--", "all", "sweep", "results/tables/sweep_cells.csv")
    assert result.returncode == 0, result.stderr[-4000:]
    return root, config


@ON_TINY_STUDY
def test_whole_dag_produces_the_tables_plots_and_provenance(tiny_study):
    root, config = tiny_study
    identity = pd.read_csv(root / "results/tables/greedy_identity.csv")
    assert list(identity.columns) == ["draft", "domain", "k", "n_sequences", "n_identical", "n_near_tie",
                                      "n_divergent"]
    assert set(identity["draft"]) == set(config["drafts"]) and len(identity) == len(config["drafts"])
    assert (identity["n_identical"] == identity["n_sequences"]).all()
    assert (identity["n_sequences"] == 2 * config["decoding"]["repeats"]).all()  # 2 prompts x 2 repeats

    study = pd.read_csv(root / "results/tables/study.csv")
    assert list(study.columns) == ["draft", "domain", "k", "temperature", "acceptance", "tokens_per_pass",
                                   "speedup_median", "speedup_lo", "speedup_hi", "n_prompts", "n_repeats"]
    sampled = config["decoding"]["sampled"]["drafts"]
    assert len(study) == len(config["drafts"]) + len(sampled) and set(study["temperature"]) == {0.0, 0.8}
    assert set(study[study["temperature"] > 0]["draft"]) == set(sampled)
    assert ((study["acceptance"] >= 0) & (study["acceptance"] <= 1)).all()
    assert (study["tokens_per_pass"] >= 1).all()
    assert (study["speedup_lo"] <= study["speedup_median"]).all()
    assert (study["speedup_median"] <= study["speedup_hi"]).all()
    assert (root / "results/tables/study.md").read_text().startswith("| draft")

    for plot in ["acceptance_heatmap.png", "speedup_vs_k.png"]:
        assert (root / "results/plots" / plot).read_bytes()[:4] == b"\x89PNG"
    provenance = yaml.safe_load((root / "results/provenance.yaml").read_text())
    assert {"date", "machine", "packages", "models", "wall_time", "config"} <= set(provenance)
    assert provenance["wall_time"]["decode_jobs"] == len(config["drafts"]) + len(sampled)
    assert set(provenance["models"]) == {"tiny-target", "tiny-draft0", "trunc1", "dist1", "head1"}
    assert provenance["models"]["head1"]["source"]["source"] == "feature_head"
    # the kernel tables every job read (invariant: timed for the record and a bf16 prompt pass), per model but the
    # feature head (its products are not timed per backend)
    assert set(provenance["linear_backends"]) == set(provenance["models"]) - {"head1"}
    assert all(set(spans.values()) <= {"linear", "weight_major", "avx2"}
               for shapes in provenance["linear_backends"].values() for spans in shapes.values())
    assert len(pd.read_csv(root / "results/study/distill/dist1/loss.csv")) == 3  # the curves' fixed homes
    head_curve = pd.read_csv(root / "results/experiments/feature-head/training/head1/loss.csv")
    assert list(head_curve["step"]) == [1, 2, 3] and head_curve["feature_loss"].gt(0).all()
    assert json.loads((root / "resources/models/head1/feature_head.json").read_text())["training_sequences"] == 1
    training = pd.read_parquet(root / "results/prompts/train.parquet")
    evaluation = pd.read_parquet(root / "results/prompts/code.parquet")
    assert len(training) == 1 and not set(training["prompt_id"]) & set(evaluation["prompt_id"])
    head_prompts = pd.read_parquet(root / "resources/feature_head/prompts.parquet")
    assert len(head_prompts) == 1 and not set(head_prompts["prompt_id"]) & set(evaluation["prompt_id"])

    distribution = pd.read_csv(root / "results/tables/distribution.csv")
    assert list(distribution.columns[:9]) == ["draft", "domain", "prompt_id", "k", "n_samples", "chi2", "dof",
                                              "p_value", "wrong_sampler_p_value"]
    assert set(distribution["draft"]) == {"adaptive"} and set(distribution["k"]) == {3}
    assert (distribution["n_samples"] == config["distribution_check"]["samples"]).all()
    assert distribution["passed"].all() and (distribution["wrong_sampler_p_value"] < distribution["threshold"]).all()

    costmodel = pd.read_csv(root / "results/tables/costmodel.csv")
    assert list(costmodel.columns[:10]) == ["draft", "domain", "k", "acceptance", "tokens_per_pass", "c",
                                            "verify_cost_ratio", "predicted_speedup", "measured_speedup", "rel_error"]
    assert set(costmodel["draft"]) == set(config["drafts"])  # every kind gets a prediction
    assert (costmodel["predicted_speedup"] > 0).all() and costmodel["rel_error"].notna().all()
    kernel = config["runtime"]["linear_kernel"]
    profile, = root.glob(f"results/machines/*/{kernel}/profiles/tiny-wide.csv")  # kept per machine and kernel
    assert set(pd.read_csv(profile)["m"]) == {1, 2, 3}  # up to max k + 1
    # the feature head's draft step is profiled beside the target (an untrained head of its vocabulary and dtype)
    # and prices its c in the machine's fit
    head_profile = profile.parent / "feature-head-v48-float32.csv"
    assert set(pd.read_csv(head_profile)["vocab_size"]) == {48} and set(pd.read_csv(head_profile)["m"]) == {1}
    fitted = pd.read_csv(profile.parent.parent / "fitted_drafts_c.csv").set_index("draft")
    assert fitted.loc["head1", "c_measured_by"] == "profile of feature-head-v48-float32"
    assert 0 < fitted.loc["head1", "c_measured"] < 1
    assert "verdict:" in (root / "results/tables/costmodel_verdict.md").read_text()
    for plot in ["layer_time_vs_width.png", "predicted_vs_measured.png"]:
        assert (root / "results/plots" / plot).read_bytes()[:4] == b"\x89PNG"

    drafts = pd.read_csv(root / "results/tables/drafts.csv")
    assert list(drafts.columns[:13]) == ["draft", "kind", "draft_layers", "target_layers", "depth_ratio",
                                         "param_ratio", "c_measured", "c_predicted", "domain", "k", "acceptance",
                                         "tokens_per_pass", "speedup_median"]
    study_cells, sweep_cells = drafts[drafts["run"] == "study"], drafts[drafts["run"] == "sweep"]
    assert set(study_cells["draft"]) == set(config["drafts"])
    assert sorted(zip(sweep_cells["draft"], sweep_cells["k"])) == [("bf16", 1), ("bf16", 2), ("lookup", 1),
                                                                   ("lookup", 2)]
    assert (sweep_cells["n_prompts"] == 1).all() and sweep_cells["speedup_median"].gt(0).all()
    by_draft = drafts.groupby("draft").first()
    # The bf16 draft reads half the bytes of the same model in fp32 (tiny models are overhead-bound, so their fitted
    # c need not follow; tests/test_costmodel.py checks that it is computed from the halved shape).
    assert by_draft.loc["bf16", "param_ratio"] == pytest.approx(by_draft.loc["tiny-draft0", "param_ratio"] / 2)
    best = pd.read_csv(root / "results/tables/best_drafts.csv")
    assert len(best) == len(config["domains"]) and best["speedup_median"].iloc[0] == drafts["speedup_median"].max()
    assert (root / "results/plots/drafts_vs_depth.png").read_bytes()[:4] == b"\x89PNG"
    for k in (1, 2):
        sweep = pd.read_parquet(root / f"results/sweep/runs/greedy/bf16/code/k{k}/seed0/sequences.parquet")
        assert sweep[sweep["method"] == "speculative"]["identical"].all()  # greedy identity in the sweep too
    assert "'dtype': 'bfloat16'" in (root / "logs/sweep/greedy/bf16/code/seed0.log").read_text()
    # the same cells as measured, without the cost model: they agree with drafts.csv where both have them
    cells = pd.read_csv(root / "results/tables/sweep_cells.csv").set_index(["draft", "k"])
    assert sorted(cells.index) == sorted(zip(sweep_cells["draft"], sweep_cells["k"]))
    assert (cells["n_identical"] == cells["n_sequences"]).all() and (cells.loc["bf16", "c"] > 0).all()
    assert (cells["verify_cost_ratio"] > 0).all() and (cells["decode_speedup_audited"] > 0).all()
    joined = sweep_cells.set_index(["draft", "k"])
    assert (cells["acceptance"] - joined.loc[cells.index, "acceptance"]).abs().max() < 1e-12
    # with their provenance: the target's and the sweep drafts' models, one benchmark per (draft, domain) job
    record = yaml.safe_load((root / "results/tables/sweep_cells.provenance.yaml").read_text())
    assert {"tiny-target", "tiny-draft0"} <= set(record["models"]) and record["machine"]["threads"] >= 1
    assert record["wall_time"]["decode_jobs"] == len(cells.reset_index()[["draft", "domain"]].drop_duplicates())


    steps = pd.read_parquet(root / "results/runs/greedy/tiny-draft0/code/k2/seed0/steps.parquet")
    for column in ["drafted", "accepted", "emitted", "draft_seconds", "verify_seconds", "catchup_seconds"]:
        assert column in steps.columns
    prompts = pd.read_parquet(root / "results/prompts/code.parquet")
    assert set(prompts["source"]) == {"humaneval", "mtbench"} and len(prompts) == 2
    assert (root / "resources/models/trunc1/manifest.json").exists()
    assert not (root / "resources/models/lookup").exists()  # prompt lookup and early exit load no model of their own


@ON_TINY_STUDY
def test_the_peers_target_plans_hugging_face_next_to_ours_for_its_drafts(tiny_study):
    root, config = tiny_study
    result = snakemake(root, "--dry-run", "--cores", "1", "--", "peers")
    assert result.returncode == 0, result.stderr[-3000:]
    assert job_counts(result.stdout) == {"peers_run": 1, "peers_table": 1, "peers": 1}, result.stdout[-3000:]
    run, = _job_blocks(result.stdout, "peers_run")
    assert "draft=bf16" in run and "domain=code" in run and "k=3" in run


@ON_TINY_STUDY
@pytest.mark.extended  # Hugging Face's generate and assisted generation next to ours: three more jobs
def test_the_peers_target_runs_hugging_face_next_to_ours(tiny_study):
    root, _ = tiny_study
    result = snakemake(root, *TWO_JOBS_AT_A_TIME, "--", "peers")
    assert result.returncode == 0, result.stderr[-4000:]
    peers = pd.read_csv(root / "results/tables/peers.csv")
    assert list(peers.columns[:9]) == ["draft", "domain", "k", "hf_generate_s_per_token", "ours_baseline_s_per_token",
                                       "hf_assisted_s_per_token", "ours_spec_s_per_token", "base_speed_ratio",
                                       "spec_speed_ratio"]
    assert set(peers["draft"]) == {"bf16"} and peers["all_tokens_identical"].all()
    assert "'dtype': 'bfloat16'" in (root / "logs/peers/bf16/code/k3.log").read_text()


@ON_TINY_STUDY
def test_a_plugin_kind_runs_through_the_whole_dag(tiny_study):
    """The toy kind of tests/toy_draft.py, defined outside specdec and named in `plugins`: decoded, checked for greedy
    identity and tabled like a built-in kind, and the config the run used still names the plugin."""
    root, config = tiny_study
    assert "toy" in config["drafts"] and config["plugins"] == ["toy_draft"]
    identity = pd.read_csv(root / "results/tables/greedy_identity.csv").set_index("draft")
    assert identity.loc["toy", "n_identical"] == identity.loc["toy", "n_sequences"] > 0
    runs = pd.read_parquet(root / "results/runs/greedy/toy/code/k2/seed0/sequences.parquet")
    assert runs[runs["method"] == "speculative"]["drafted"].sum() > 0  # the toy proposed
    drafts = pd.read_csv(root / "results/tables/drafts.csv")
    toy = drafts[drafts["draft"] == "toy"]
    assert len(toy) == len(config["domains"]) and (toy["kind"] == "repeat_last").all()
    provenance = yaml.safe_load((root / "results/provenance.yaml").read_text())
    assert provenance["config"]["plugins"] == ["toy_draft"]


@ON_TINY_STUDY
def test_report_collects_tables_and_plots(tiny_study):
    root, _ = tiny_study
    result = snakemake(root, "--cores", "1", "--report", str(root / "report.html"))
    assert result.returncode == 0, result.stderr[-3000:]
    html = (root / "report.html").read_text(errors="replace")
    for item in ["study.csv", "greedy_identity.csv", "acceptance_heatmap.png", "speedup_vs_k.png"]:
        assert item in html, item


@ON_TINY_STUDY
@pytest.mark.extended  # the GGUF study of test_workflow_gguf.py runs `reproduce` in the full suite
def test_reproduce_target_reruns_and_matches(tiny_study):
    root, config = tiny_study
    result = snakemake(root, *TWO_JOBS_AT_A_TIME, "--", "reproduce")  # "--": --set-threads takes a list
    assert result.returncode == 0, result.stderr[-4000:]
    table = pd.read_csv(root / "results/tables/reproduce.csv")
    assert len(table) == 1 and table["reproduced"].all() and table["same_tokens"].all()
    row = table.iloc[0]
    # the rerun covers the first of the 2 prompts (reproduce.prompts_per_domain: 1), with 2 repeats
    assert row["acceptance_first"] == row["acceptance_rerun"] and row["n_pairs"] == 1 * 2
    assert row["speedup_min"] <= row["speedup_median"] <= row["speedup_max"]
    assert len(row["speedup_by_repeat"].split()) == 2


@ON_TINY_STUDY
def test_complete_run_has_nothing_to_do(tiny_study):
    root, _ = tiny_study
    result = snakemake(root, "--dry-run", "--cores", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert job_counts(result.stdout) == {}, result.stdout[-3000:]


@ON_TINY_STUDY
def test_adding_a_k_a_draft_and_a_draft_kind_schedules_only_their_jobs(tiny_study, tmp_path):
    """On the finished study: a new k decodes every draft greedily at it; a new model draft and a new truncated kind
    each get their model (prepared, derived) and their decode jobs in both settings; nothing else is decoded and no
    prompt is made again."""
    root, config = tiny_study
    more = copy.deepcopy(config)
    more["decoding"]["k"] = config["decoding"]["k"] + [3]
    more["draft_kinds"] = dict(config["draft_kinds"], trunc2={"kind": "truncated", "model": "tiny-draft0", "layers": 2})
    new = ["tiny-draft1", "trunc2"]
    more["drafts"] = config["drafts"] + new
    more["decoding"]["sampled"]["drafts"] = config["decoding"]["sampled"]["drafts"] + new
    result = snakemake(root, "--dry-run", "--cores", "1", configfile=write_config(tmp_path / "more.yaml", more))
    assert result.returncode == 0, result.stderr[-3000:]
    counts = job_counts(result.stdout)
    assert counts["prepare_model"] == 1 and counts["derive_truncated_draft"] == 1 and "make_prompts" not in counts
    assert "model=tiny-draft1" in _job_blocks(result.stdout, "prepare_model")[0]
    assert "derived=trunc2" in _job_blocks(result.stdout, "derive_truncated_draft")[0]
    scheduled = {tuple(re.search(rf"{key}=(\S+?)(?:,|\n|$)", block).group(1) for key in ("setting", "draft", "k"))
                 for block in _job_blocks(result.stdout, "decode")}
    expected = {("greedy", draft, "3") for draft in more["drafts"]}
    expected |= {(setting, draft, "2") for draft in new for setting in ("greedy", "sampled")}
    assert scheduled == expected and counts["decode"] == len(expected), sorted(scheduled ^ expected)


@ON_TINY_STUDY
def test_a_one_domain_layer_decodes_only_that_domain(tiny_study):
    """experiments/long-code's shape: one domain, a longer generation, its own results_dir."""
    root, config = tiny_study
    layer = {"results_dir": "results/long", "domains": {"other": copy.deepcopy(config["domains"]["code"])},
             "decoding": {"domains": ["code"], "k": [2], "max_new_tokens": 9, "sampled": None}}
    result = snakemake(root, "--dry-run", "--cores", "1", "--", "results/long/tables/study.csv",
                       configfile=write_config(root / "long.yaml", layer))
    assert result.returncode == 0, result.stderr[-3000:]
    blocks = _job_blocks(result.stdout, "decode")
    assert len(blocks) == len(config["drafts"])  # not 2x: the layer's second domain is not decoded
    assert all("domain=code" in b and "setting=greedy" in b and "k=2" in b for b in blocks)
    assert "prepare_model" not in job_counts(result.stdout)


@ON_TINY_STUDY
def test_a_layer_with_its_own_results_dir_reuses_the_heads_data_and_training(tiny_study):
    """The heads' prompts, data and weights live under resources/, shared by every results directory and regime:
    a layer writing elsewhere (whose evaluation prompts are not made yet) plans none of them again. (The tiny study
    makes its data on the safetensors engine, which reads the machine's kernel tables: the layer shares those.)"""
    root, _ = tiny_study
    layer = {"results_dir": "results/elsewhere", "machines_dir": "results/machines"}
    result = snakemake(root, "--dry-run", "--cores", "1", "--", "resources/models/head1",
                       configfile=write_config(root / "elsewhere.yaml", layer))
    assert result.returncode == 0, result.stderr[-3000:]
    assert job_counts(result.stdout) == {}, result.stdout[-3000:]


@ON_TINY_STUDY
def test_a_machine_check_layer_adds_its_cells_to_the_study_machines(tiny_study):
    """experiments/machine-check's shape: its own results_dir, the study's machines_dir, a sweep of a plain model
    (a name under `models`, not `draft_kinds`) and of a defined draft. Its per-machine tables go next to the study's
    fit; it reuses the study's profiles and profiles only the model the study never ran."""
    root, config = tiny_study
    machine_dir = next(p for p in (root / "results/machines").iterdir() if p.name != "second-fake-machine")
    machine_dir = machine_dir.relative_to(root)
    layer = {"results_dir": "results/check", "machines_dir": "results/machines", "drafts": ["tiny-draft0"],
             "decoding": {"k": [2], "sampled": None},
             "draft_sweep": {"drafts": ["tiny-draft1", "bf16"], "k": [2], "prompts_per_domain": 1}}
    result = snakemake(root, "--dry-run", "--cores", "1", "--", "results/check/tables/drafts.csv",
                       configfile=write_config(root / "check.yaml", layer))
    assert result.returncode == 0, result.stderr[-3000:]
    counts = job_counts(result.stdout)
    profiled = [re.search(r"profiled=(\S+)", b).group(1) for b in _job_blocks(result.stdout, "profile_model")]
    assert counts["sweep_decode"] == 2 and profiled == ["tiny-draft1"], (counts, profiled)
    assert "measure_bandwidth" not in counts and "machine_fit" not in counts
    outputs = [out.strip() for line in result.stdout.splitlines() if line.strip().startswith("output:")
               for out in line.split(":", 1)[1].split(",")]
    kept = {Path(o).name for o in outputs if o.startswith(f"{machine_dir}/")}
    assert {"drafts.csv", "sweep_drafts_c.csv", "drafts_c.csv"} <= kept, kept
    assert all(o.startswith(("results/check/", f"{machine_dir}/")) for o in outputs if o.startswith("results/"))


@ON_TINY_STUDY
def test_adding_a_draft_to_the_sweep_schedules_one_job_per_domain(tiny_study):
    root, config = tiny_study
    more = copy.deepcopy(config)
    more["draft_sweep"]["drafts"] = config["draft_sweep"]["drafts"] + ["early1"]
    result = snakemake(root, "--dry-run", "--cores", "1", "sweep",
                       configfile=write_config(root / "more_sweep.yaml", more))
    assert result.returncode == 0, result.stderr[-3000:]
    counts = job_counts(result.stdout)
    assert counts["sweep_decode"] == len(config["domains"]) and "decode" not in counts
    assert counts["drafts_table"] == 1 and "prepare_model" not in counts
    assert "costmodel" not in counts  # the study's fit and audit do not wait for the sweep
    assert all("draft=early1" in b for b in _job_blocks(result.stdout, "sweep_decode"))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c["decoding"].update(kk=[1]), "'kk' was unexpected"),
        (lambda c: c["decoding"].update(k=[0]), "minimum"),
        (lambda c: c["decoding"].update(k="4"), "'4' is not of type 'array'"),
        (lambda c: c["decoding"]["sampled"].update(temperature=-0.5), "temperature"),
        (lambda c: c["decoding"]["sampled"].update(top_p=1.5), "top_p"),
        (lambda c: c.update(drafts=["no-such-model"]), "no-such-model"),
        (lambda c: c.update(draft_kinds={"x": {"kind": "truncated", "model": "tiny-target"}}), "layers"),
        (lambda c: c.update(draft_kinds={"x": {"kind": "medusa"}}), "medusa"),
        (lambda c: c["domains"]["code"]["sources"].append({"set": "nope"}), "nope"),
        (lambda c: c["models"]["tiny-target"].update(source="ftp"), "ftp"),
        (lambda c: c["prompts"].update(per_domain=0), "config key 'prompts.per_domain'"),
        (lambda c: c.update(drafts=["tiny-target"]), "is the target itself"),
        (lambda c: c["distribution_check"].update(top_k=50), "config key 'distribution_check.top_k'"),
        (lambda c: c["distribution_check"].update(drafts=["tiny-draft9"]), "'distribution_check.drafts'"),
        (lambda c: c.update(draft_kinds={"x": {"kind": "early_exit", "layers": 1, "dtype": "bfloat16"}}),
         "config key 'draft_kinds.x.dtype'"),
        (lambda c: c.update(draft_kinds={"x": {"kind": "model", "model": "tiny-target", "dtype": "int4"}}), "int4"),
        (lambda c: c.update(draft_sweep={"drafts": ["nope-draft"]}), "config key 'draft_sweep.drafts'"),
        (lambda c: c.update(draft_sweep={"drafts": ["tiny-draft0"],
                                         "per_draft": {"tiny-draft1": {"domains": ["code"]}}}),
         "config key 'draft_sweep.per_draft.tiny-draft1'"),
        (lambda c: c.update(draft_sweep={"drafts": ["tiny-draft0"], "domains": ["poetry"]}), "'poetry'"),
        (lambda c: c["decoding"].update(domains=["poetry"]), "config key 'decoding.domains': 'poetry'"),
        (lambda c: c.update(distillation={"domains": {"x": {"sources": [{"set": "nope"}]}}}),
         "config key 'distillation.domains.x.sources'"),
        (lambda c: c.update(feature_head={"data": {"domains": {"x": {"sources": [{"set": "nope"}]}}}}),
         "config key 'feature_head.data.domains.x.sources'"),
        (lambda c: c.update(draft_kinds={"h": {"kind": "feature_head", "head": "lookup"},
                                         "lookup": {"kind": "prompt_lookup"}}),
         "config key 'draft_kinds.h.head': 'lookup' is not a feature_head draft"),
        (lambda c: c.update(draft_kinds={"h": {"kind": "feature_head", "training": {"data": ["answers", "web"]}}}),
         "config key 'draft_kinds.h.training.data': 'web' is not one of ['answers', 'corpus', 'answers_layers'"),
        (lambda c: c.update(draft_kinds={"h": {"kind": "feature_head", "training": {"data": ["corpus"]}}}),
         "config key 'draft_kinds.h.training.data': corpus needs feature_head.corpus"),
        (lambda c: c.update(draft_kinds={"h": {"kind": "feature_head", "training": {
            "data": ["answers_layers"], "fused_layers": [0, 1]}}}, feature_head={"fused_layers": [1, 2]}),
         "config key 'draft_kinds.h.training.data': answers_layers holds the outputs of layers [1, 2] "
         "(feature_head.fused_layers for *_layers data), the head fuses [0, 1] (training.fused_layers)"),
        (lambda c: c.update(draft_kinds={"h": {"kind": "feature_head", "training": {"fused_layers": [1]}}}),
         "config key 'draft_kinds.h.training.data': answers holds the outputs of layers [] "),
        (lambda c: c.update(draft_kinds={"h": {"kind": "feature_head", "training": {"init": "lookup"}},
                                         "lookup": {"kind": "prompt_lookup"}}),
         "config key 'draft_kinds.h.training.init': 'lookup' is not another feature_head draft"),
        (lambda c: c.update(feature_head={"corpus": {"parts": {"p": {
            "archive_of": "nope", "file_glob": "*.py", "instruction": "{path}", "sequences": 1}}}}),
         "config key 'feature_head.corpus.parts.p.archive_of': 'nope' is not under 'prompt_sources'"),
        (lambda c: c.update(draft_kinds={"h": {"kind": "feature_head"}, "hq": {"kind": "feature_head", "head": "h"}},
                            head_agreement={"heads": ["h", "hq"]}),
         "config key 'head_agreement.heads': 'hq' is not a feature_head draft with a head of its own"),
        (lambda c: c.update(draft_kinds={"h": {"kind": "feature_head"}},
                            head_agreement={"heads": ["h"], "domains": ["poetry"]}),
         "config key 'head_agreement.domains': 'poetry' is not under 'domains'"),
    ],
    ids=["misspelled key", "k < 1", "wrong type", "temperature < 0", "top-p > 1", "unknown draft",
         "truncated draft without layers", "unknown draft kind", "unknown prompt set", "unknown source",
         "no prompts", "target as draft", "distribution top-k too large", "distribution draft not studied",
         "dtype for a draft without weights", "unknown draft dtype", "unknown sweep draft",
         "per-draft override of a draft not swept", "unknown sweep domain", "unknown decoding domain",
         "unknown training prompt set", "unknown head training prompt set", "head shared from a non-head",
         "unknown head data", "head corpus without a corpus", "layer data without a fused layer",
         "a fusing head on data without its layers", "head started from a non-head",
         "corpus of an unknown archive", "agreement of a head without its own", "agreement on an unknown domain"],
)
def test_invalid_config_is_refused_naming_the_key(tmp_path, mutate, message):
    config = build_tiny_study(tmp_path)
    validate_config(copy.deepcopy(config), SCHEMA)  # the untouched config is valid
    mutate(config)
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config(config, SCHEMA)


def test_a_layer_drops_a_sweep_override_with_null(tmp_path):
    """experiments/feature-head sweeps other drafts than config.yaml, whose per_draft names one it does not sweep."""
    config = build_tiny_study(tmp_path)
    config["draft_sweep"] = {"drafts": ["tiny-draft0"],
                             "per_draft": {"lookup": None, "tiny-draft0": {"domains": ["code"]}}}
    validate_config(config, SCHEMA)
    config["draft_sweep"]["per_draft"]["lookup"] = {"domains": ["code"]}
    with pytest.raises(ConfigError, match="'draft_sweep.per_draft.lookup'"):
        validate_config(config, SCHEMA)


@ON_TINY_STUDY
def test_snakemake_stops_on_an_invalid_config_before_any_job(tiny_study, tmp_path):
    """The Snakefile's start-up runs validate_config (the schema, then the semantic checks; each check is tried
    alone in test_invalid_config_is_refused_naming_the_key): an unknown draft in an otherwise valid config."""
    root, config = tiny_study
    bad = copy.deepcopy(config)
    bad["drafts"] = ["no-such-model"]
    result = snakemake(root, "--dry-run", "--cores", "1", configfile=write_config(tmp_path / "bad.yaml", bad))
    assert result.returncode != 0
    assert "config key 'drafts': 'no-such-model'" in result.stdout + result.stderr, \
        (result.stdout + result.stderr)[-3000:]


@pytest.fixture(scope="module")
def fresh_study(tmp_path_factory):
    """A tiny study that has not run: dry runs show every job."""
    root = tmp_path_factory.mktemp("fresh-study")
    return root, build_tiny_study(root)


def _job_blocks(dry_run_output: str, rule: str) -> list[str]:
    blocks = dry_run_output.split("\nrule ")
    return [b for b in blocks if b.startswith(f"{rule}:")]


def test_slurm_profile_dry_run_sets_threads_and_resources(fresh_study):
    root, _ = fresh_study
    result = snakemake(root, "--profile", str(REPO / "profiles/slurm"), "--dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    decode_jobs = _job_blocks(result.stdout, "decode")
    assert len(decode_jobs) == 6
    assert all("mem_mb=14000" in b and "runtime=120" in b for b in decode_jobs)
    assert all("mem_mb=16000" in b for b in _job_blocks(result.stdout, "prepare_model"))
    # a dry run with the slurm executor does not print threads; the local executor shows the profile's set-threads
    local = snakemake(root, "--profile", str(REPO / "profiles/slurm"), "--executor", "local", "--cores", "8",
                      "--dry-run")
    assert local.returncode == 0, local.stderr[-3000:]
    assert all("threads: 8" in b for b in _job_blocks(local.stdout, "decode"))


def test_cuda_device_requests_a_gpu_for_decode_jobs(fresh_study, tmp_path):
    root, config = fresh_study
    cuda = copy.deepcopy(config)
    cuda["runtime"]["device"] = "cuda"
    layer = write_config(tmp_path / "cuda.yaml", cuda)
    if not __import__("torch").cuda.is_available():  # the machine is the GPU: none here, a clear refusal
        refused = snakemake(root, "--dry-run", "--cores", "1", configfile=layer)
        assert refused.returncode != 0 and "config key 'runtime.device'" in refused.stdout + refused.stderr
    result = snakemake(root, "--dry-run", "--cores", "1", configfile=layer,
                       env={"SPECDEC_MACHINE": "nvidia-h200-cuda13.0-torch2.11.0"})
    assert result.returncode == 0, result.stderr[-3000:]
    decode_jobs = _job_blocks(result.stdout, "decode")
    assert decode_jobs and all("gpu=1" in b for b in decode_jobs)



@ON_TINY_STUDY
@pytest.mark.extended  # profiles and fits a second machine: a few minutes of its own
def test_a_second_machine_adds_its_own_profiles_and_fit_and_overwrites_nothing(tiny_study):
    root, config = tiny_study
    first = [p for p in (root / "results/machines").iterdir()]
    assert len(first) == 1  # the machine the tiny study ran on
    result = snakemake(root, "--dry-run", "--cores", "1", "--", "machine",
                       env={"SPECDEC_MACHINE": "second-fake-machine"})
    assert result.returncode == 0, result.stderr[-3000:]
    counts = job_counts(result.stdout)
    for rule in ("time_linear_backends", "profile_fit_models", "measure_bandwidth", "machine_fit", "machines"):
        assert counts.get(rule), (rule, counts)
    # profiles and a fit are all a machine needs to join the verdict: no decoding, no audit
    assert not {"decode", "sweep_decode", "costmodel"} & set(counts), counts
    outputs = [out.strip() for line in result.stdout.splitlines() if line.strip().startswith("output:")
               for out in line.split(":", 1)[1].split(",")]
    machine_outputs = [o for o in outputs if o.startswith("results/machines/")]
    assert machine_outputs and all(o.startswith("results/machines/second-fake-machine/") for o in machine_outputs)
    # the fit of every machine feeds the one verdict: the first machine's is an input of the machines table
    machines_job = _job_blocks(result.stdout, "machines")[0]
    kernel = config["runtime"]["linear_kernel"]
    assert f"{first[0].relative_to(root)}/{kernel}/costmodel_terms.csv" in machines_job

    # Run it: the second machine's profiles and fit appear, the first machine's files stay byte for byte.
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in first[0].rglob("*") if p.is_file()}
    result = snakemake(root, "--cores", "1", "--", "machine", env={"SPECDEC_MACHINE": "second-fake-machine"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert before == {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in first[0].rglob("*") if p.is_file()}
    second = root / f"results/machines/second-fake-machine/{kernel}"
    assert {"costmodel_terms.csv", "fitted_drafts_c.csv", "shapes.csv", "bandwidth.json"} <= {
        p.name for p in second.iterdir()}
    table = pd.read_csv(root / "results/tables/machines.csv")
    assert {first[0].name, "second-fake-machine"} <= set(table["machine"])
    assert (table[table["source"] == "fit"].groupby("machine").size() == 1).all()  # one fitted row per machine
    drafts = pd.read_csv(root / f"results/machines/second-fake-machine/{kernel}/fitted_drafts_c.csv").set_index("draft")
    assert drafts.loc["tiny-draft0", "c_measured_by"] == "profile" and drafts.loc["early1", "draft_layers"] == 1


# --- interruption: kill the workflow in the middle of its decoding jobs, rerun, lose nothing ----------------------
# The interrupted runs decode with tests/gated_draft.py's `gated_prompt_lookup`: the tiny study's prompt lookup, whose
# jobs wait at their first proposal until the test lets them through. Every signal is sent while a decode job is known
# to be running, and after the jobs the test let through are known to be finished, never after a guessed delay.
DETERMINISTIC = ["draft", "domain", "k", "temperature", "acceptance", "tokens_per_pass", "n_prompts", "n_repeats"]
JOB_TIMEOUT_S = 600  # a tiny decode job reaches its first proposal in seconds; a busy shared machine gets ample margin


def _gated_lookup_study(root: Path, drafts: list[str], left_out: tuple[str, ...],
                        ungated: tuple[str, ...] = ()) -> dict:
    """The tiny study, less the stages `left_out`, decoding with `drafts`: each the tiny study's `lookup` behind the
    gate root/gate (so its tables equal lookup's), and the `ungated` drafts of the tiny study as they are."""
    config = tiny_config(root)
    for stage in left_out:
        config.pop(stage)
    for name in drafts:
        config["draft_kinds"][name] = {**ALL_DRAFT_KINDS["lookup"], "kind": "gated_prompt_lookup",
                                       "gate": str(root / "gate")}
    config["drafts"], config["plugins"] = [*drafts, *ungated], [*config["plugins"], "gated_draft"]
    config["decoding"]["sampled"]["drafts"] = list(config["drafts"])  # studied drafts only (the config check)
    write_config(root / "config.yaml", config)
    return config


class Gate:
    """The test's side of tests/gated_draft.py: the decode jobs waiting at the gate, and letting them through."""

    def __init__(self, root: Path):
        self.path = root / "gate"
        self.path.mkdir()

    def next_waiting_job(self, proc: subprocess.Popen, log: Path) -> tuple[str, dict]:
        """(marker, wildcards) of a decode job waiting at the gate, as soon as one is; the test fails if the run ends
        first or no job gets there within JOB_TIMEOUT_S."""
        deadline = time.time() + JOB_TIMEOUT_S
        while time.time() < deadline:
            waiting = [m for m in self.path.glob("*.running") if not m.with_suffix(".go").exists()]
            if waiting:
                return waiting[0].stem, json.loads(waiting[0].read_text())
            if proc.poll() is not None:
                pytest.fail(f"the workflow ended with no decode job at the gate: {log.read_text()[-3000:]}")
            time.sleep(0.2)
        pytest.fail(f"no decode job reached the gate within {JOB_TIMEOUT_S} s: {log.read_text()[-3000:]}")

    def let_through(self, marker: str) -> None:
        (self.path / f"{marker}.go").touch()

    def open(self) -> None:
        """Let every job through, now and later."""
        (self.path / "open").touch()

    def forget_killed_jobs(self) -> None:
        """Drop the markers of jobs that waited when their run was stopped (they are gone)."""
        for marker in self.path.glob("*.running"):
            if not marker.with_suffix(".go").exists():
                marker.unlink()


def _start(root: Path) -> tuple[subprocess.Popen, Path]:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(root),
           "--configfile", str(root / "config.yaml"), "--cores", "1", "--rerun-incomplete"]
    log_path = root / f"interrupted-run-{time.time_ns()}.log"
    log = open(log_path, "w")
    # SIG_DFL in the child: a test run started in the background (`cmd &`) inherits SIGINT ignored, and a Python
    # that starts with SIGINT ignored never turns it into KeyboardInterrupt, so Ctrl-C could not be simulated.
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", **PLUGIN_PATH),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return proc, log_path


def _stop_when_a_decode_job_waits(root: Path, gate: Gate, sig: signal.Signals,
                                  let_through: int) -> tuple[list[dict], dict, str, float]:
    """Start the workflow, let `let_through` decode jobs past the gate, and once the next one waits there send `sig`
    to the whole process group (Snakemake and that job), as Ctrl-C in a terminal or a killed node would. With
    --cores 1 the next job starts only after Snakemake has recorded the previous one as finished. Returns the
    wildcards of the jobs let through, those of the job stopped, the run's log and the seconds it took to stop."""
    proc, log = _start(root)
    try:
        finished = []
        for _ in range(let_through):
            marker, wildcards = gate.next_waiting_job(proc, log)
            gate.let_through(marker)
            finished.append(wildcards)
        _, stopped = gate.next_waiting_job(proc, log)
        os.killpg(proc.pid, sig)
        signalled = time.time()
        proc.wait(timeout=120)
        stop_seconds = time.time() - signalled
    finally:
        if proc.poll() is None:  # the test failed on the way: leave no workflow waiting at the gate
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    gate.forget_killed_jobs()
    return finished, stopped, log.read_text(), stop_seconds


def _run_dir(wildcards: dict) -> str:
    w = wildcards
    return f"results/runs/{w['setting']}/{w['draft']}/{w['domain']}/k{w['k']}/seed{w['seed']}/"


def _finished_outputs(root: Path) -> dict[str, float]:
    """The parquet files of jobs Snakemake counts as finished (a rerun would not schedule them), with their mtimes;
    every parquet file present must read back whole."""
    files = [str(p.relative_to(root)) for p in root.glob("results/**/*.parquet")]
    for path in files:
        pd.read_parquet(root / path)  # raises on a truncated or half-written file
    # a killed Snakemake leaves its lock
    assert snakemake(root, "--unlock", "--cores", "1").returncode == 0
    dry = snakemake(root, "--dry-run", "--cores", "1", "--rerun-incomplete")
    assert dry.returncode == 0, dry.stderr[-3000:]
    scheduled = {out.strip() for line in dry.stdout.splitlines() if line.strip().startswith("output:")
                 for out in line.split(":", 1)[1].split(",")}
    return {p: (root / p).stat().st_mtime for p in files if p not in scheduled}


def _in_dir(files, directory: str) -> list[str]:
    return [f for f in files if f.startswith(directory)]


def _files_under(directory: Path) -> list[Path]:
    """Files only: Snakemake makes a job's output directories before the job starts."""
    return [p for p in directory.rglob("*") if p.is_file()]


@pytest.mark.extended  # a study of its own, stopped twice and resumed: about three minutes
def test_interrupted_runs_resume_without_loss(tmp_path):
    # The decode stage is what gets interrupted; the stages after the study table are left out to keep this short.
    # Two gated lookup drafts, greedy and sampled: four decode jobs, so that each interruption comes after one more
    # job has finished and while another runs. The study's own `lookup` (no gate) is never stopped: the reference.
    drafts = ["gated", "gated_again"]
    _gated_lookup_study(tmp_path, drafts, ("distribution_check", "profiling", "peers", "reproduce", "distillation"),
                        ungated=["lookup"])
    gate = Gate(tmp_path)

    # Ctrl-C (SIGINT to the process group) while a decode job runs: the job says so in one line naming it, no
    # traceback, Snakemake stops within seconds, leaves no lock, and nothing half-written stays.
    finished, stopped, output, stop_seconds = _stop_when_a_decode_job_waits(tmp_path, gate, signal.SIGINT,
                                                                            let_through=1)
    assert stop_seconds < 30, "the run did not stop within seconds"
    job = ", ".join(f"{k}={v}" for k, v in stopped.items())
    lines = [line for line in output.splitlines() if "interrupted, nothing written" in line]
    assert lines == [f"specdec: decode ({job}) interrupted, nothing written; rerun the same command to resume"], \
        output[-3000:]  # one line, from the one job that ran (--cores 1)
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    dry = snakemake(tmp_path, "--dry-run", "--cores", "1")  # no --unlock: no lock was left
    assert dry.returncode == 0 and job_counts(dry.stdout).get("decode", 0) >= 1, dry.stdout[-2000:] + dry.stderr[-2000:]
    after_sigint = _finished_outputs(tmp_path)
    assert len(_in_dir(after_sigint, _run_dir(finished[0]))) == 2, sorted(after_sigint)  # steps and sequences
    assert not _files_under(tmp_path / _run_dir(stopped)), "the job stopped by Ctrl-C left files"

    finished, stopped, killed_run, _ = _stop_when_a_decode_job_waits(tmp_path, gate, signal.SIGKILL, let_through=1)
    after_sigkill = _finished_outputs(tmp_path)
    assert {p: after_sigkill.get(p) for p in after_sigint} == after_sigint, "finished jobs were redone"
    assert len(_in_dir(after_sigkill, _run_dir(finished[0]))) == 2, sorted(after_sigkill)  # the rerun went on
    assert not _in_dir(after_sigkill, _run_dir(stopped)), "the killed job counts as finished"
    assert "(100%) done" not in killed_run, killed_run[-2000:]

    # README: after an interruption rerun the same command (after a hard kill, --unlock first: _finished_outputs did).
    gate.open()
    result = snakemake(tmp_path, *TWO_JOBS_AT_A_TIME, "--rerun-incomplete")
    assert result.returncode == 0, result.stderr[-3000:]
    final = _finished_outputs(tmp_path)
    assert {p: final.get(p) for p in after_sigkill} == after_sigkill, "finished jobs were redone"
    resumed = pd.read_csv(tmp_path / "results/tables/study.csv")[DETERMINISTIC]
    reference = resumed[resumed["draft"] == "lookup"].reset_index(drop=True)
    assert len(reference) == 2  # greedy and sampled
    for draft in drafts:  # each interrupted, resumed draft decodes as the uninterrupted lookup did
        rows = resumed[resumed["draft"] == draft].assign(draft="lookup").reset_index(drop=True)
        pd.testing.assert_frame_equal(rows, reference)


# The study's layers (config/*.yaml) and every experiment's (experiments/<name>/config.yaml): each header gives the
# commands that run it.
LAYERS = sorted([*(REPO / "config").glob("*.yaml"), *(REPO / "experiments").glob("*/config.yaml")])


def layer_commands(layer: Path) -> list[list[str]]:
    """The `snakemake ...` commands of a layer's header comments (its first comment lines; a line ending in a
    backslash goes on in the next), as argument lists without `snakemake`; an aside after two spaces and "(" is not
    part of the command."""
    lines = []
    for line in layer.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    commands, current = [], None
    for line in lines:
        if current is None and not line.startswith("snakemake "):
            continue
        part = re.split(r"\s{2,}\(", line.removesuffix("\\"))[0].strip()
        current = part if current is None else f"{current} {part}"
        if not line.endswith("\\"):
            commands.append(shlex.split(current)[1:])
            current = None
    return commands


def stacked_files(args: list[str]) -> list[str]:
    """The files a command's --configfile stacks, in order."""
    start = args.index("--configfile") + 1 if "--configfile" in args else len(args)
    return list(itertools.takewhile(lambda a: not a.startswith("-"), args[start:]))


def documented_commands() -> list[tuple[str, list[str]]]:
    return [(str(layer.relative_to(REPO)), args) for layer in LAYERS for args in layer_commands(layer)]


def test_every_layer_gives_a_command_that_stacks_it():
    assert len(LAYERS) >= 20 and (REPO / "config/quick.yaml") in LAYERS
    for layer in LAYERS:
        name = str(layer.relative_to(REPO))
        assert any(name in stacked_files(args)
                   for args in layer_commands(layer)), f"{name} gives no command stacking it"


@pytest.mark.parametrize("layer, args", documented_commands(),
                         ids=[f"{layer}:{i}" for i, (layer, _) in enumerate(documented_commands())])
def test_every_layers_commands_make_a_valid_config_and_plan(layer, args):
    """Each command a layer's header gives makes a valid config (a layer that sweeps other drafts must also say which
    the reproduce check and the others read: what Snakemake's start-up checks before any job), and Snakemake plans
    it: a dry run of the command as typed, every job listed."""
    from snakemake.utils import update_config

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    for name in stacked_files(args):
        update_config(config, yaml.safe_load((REPO / name).read_text()) or {})
    if "--config" in args:
        overrides = itertools.takewhile(lambda a: not a.startswith("-"), args[args.index("--config") + 1:])
        update_config(config, dict(item.split("=", 1) for item in overrides))
    validate_config(config, SCHEMA)
    # a GPU layer's machine is its GPU: named here where torch sees none (a GPU's id, as machine_id spells one)
    gpu = {"SPECDEC_MACHINE": "nvidia-h200-cuda13.0-torch2.11.0"} if config["runtime"].get("device") == "cuda" else {}
    result = snakemake_runs.run(["--dry-run", "--forceall", "--nolock", *args], cwd=REPO, env=dict(os.environ, **gpu))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]


def test_the_machine_target_on_random_weights_needs_no_weights(tmp_path):
    """profiling.weights random (config/random-weights.yaml; a lent GPU where the weights cannot travel): the machine
    target profiles random weights of each model's architecture and fits them like any machine, never preparing a
    model; a profiled model without an architecture is refused at planning, naming the key."""
    config = build_tiny_study(tmp_path)
    fields = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "tie_word_embeddings")
    architectures = {}
    for name, spec in config["models"].items():
        own = json.loads((Path(spec["path"]) / "config.json").read_text())
        architectures[name] = {k: v for k, v in own.items() if k in fields}
    architectures["tiny-draft0"]["num_hidden_layers"] = 1  # a shape of its own: the profile must follow it
    layer = {"runtime": {"linear_kernel": "default"}, "profiling": {"weights": "random", "repeats": 2}}
    machine = {"SPECDEC_MACHINE": "random-weights-machine"}
    missing = {**layer, "profiling": {**layer["profiling"], "architectures": {
        k: v for k, v in architectures.items() if k != "tiny-draft0"}}}
    refused = snakemake(tmp_path, "--dry-run", "--cores", "1", "--", "machine", env=machine,
                        configfile=write_config(tmp_path / "random.yaml", {**config, **missing}))
    assert refused.returncode != 0 and "profiling.architectures.tiny-draft0" in refused.stdout + refused.stderr
    layer["profiling"]["architectures"] = architectures
    result = snakemake(tmp_path, "--cores", "1", "--", "machine", env=machine,
                       configfile=write_config(tmp_path / "random.yaml", {**config, **layer}))
    assert result.returncode == 0, result.stderr[-3000:]
    fit = tmp_path / "results/machines/random-weights-machine/default"
    assert {"costmodel_terms.csv", "fitted_drafts_c.csv", "shapes.csv", "bandwidth.json"} <= {
        p.name for p in fit.iterdir()}
    shapes = pd.read_csv(fit / "shapes.csv").set_index("model")
    for name, architecture in architectures.items():  # the profiles timed the architectures asked for
        assert shapes.loc[name, "n_layers"] == architecture["num_hidden_layers"], name
        assert shapes.loc[name, "hidden_size"] == architecture["hidden_size"], name
    assert not (tmp_path / "resources/models").exists()  # no model was prepared


def test_the_whole_study_runs_in_fixed_shape_sessions(tmp_path):
    """runtime.session fixed (config/gpu.yaml's session, here on the CPU with torch's kernels): every stage of the
    default target runs through FixedShapeLMs; greedy identity holds with no near-tie (a pass is one shape, so a
    divergence could only be a bug), and the steps and the provenance say which session ran."""
    config = build_tiny_study(tmp_path, k=[2])
    config["runtime"].update({"session": "fixed", "session_rows": 4, "linear_kernel": "default"})
    write_config(tmp_path / "config.yaml", config)
    result = snakemake(tmp_path, *TWO_JOBS_AT_A_TIME)
    assert result.returncode == 0, result.stderr[-3000:]
    identity = pd.read_csv(tmp_path / "results/tables/greedy_identity.csv")
    assert (identity["n_identical"] == identity["n_sequences"]).all() and (identity["n_near_tie"] == 0).all()
    steps = pd.read_parquet(tmp_path / "results/runs/greedy/tiny-draft0/code/k2/seed0/steps.parquet")
    assert steps["kernel"].str.startswith("fixed4:").all()
    provenance = yaml.safe_load((tmp_path / "results/provenance.yaml").read_text())
    assert provenance["config"]["runtime"]["session"] == "fixed"
