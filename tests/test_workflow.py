"""The Snakemake workflow on a tiny study: the whole DAG runs, caching schedules only what changed, bad configs are
refused with the offending key named."""

import copy
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from specdec.testing import build_tiny_study

REPO = Path(__file__).resolve().parents[1]


def snakemake(workdir: Path, *args: str, configfile: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(configfile or workdir / "config.yaml"), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)


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


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-study")
    config = build_tiny_study(root, drafts=2)
    config["drafts"] = ["tiny-draft0"]  # the second draft is added by a test below
    write_config(root / "config.yaml", config)
    result = snakemake(root, "--cores", "1")
    assert result.returncode == 0, result.stderr[-4000:]
    return root, config


def test_whole_dag_produces_the_tables_plots_and_provenance(tiny_study):
    root, config = tiny_study
    identity = pd.read_csv(root / "results/tables/greedy_identity.csv")
    assert list(identity.columns) == ["draft", "domain", "k", "n_sequences", "n_identical", "n_near_tie",
                                      "n_divergent"]
    assert len(identity) == len(config["domains"]) * len(config["decoding"]["k"])
    assert (identity["n_identical"] == identity["n_sequences"]).all()
    # 2 prompts x 2 repeats per (domain, k)
    assert (identity["n_sequences"] == 2 * config["decoding"]["repeats"]).all()

    study = pd.read_csv(root / "results/tables/study.csv")
    assert list(study.columns) == ["draft", "domain", "k", "temperature", "acceptance", "tokens_per_pass",
                                   "speedup_median", "speedup_lo", "speedup_hi", "n_prompts", "n_repeats"]
    assert set(study["temperature"]) == {0.0, 0.8}
    assert ((study["acceptance"] >= 0) & (study["acceptance"] <= 1)).all()
    assert (study["tokens_per_pass"] >= 1).all()
    assert (study["speedup_lo"] <= study["speedup_median"]).all()
    assert (study["speedup_median"] <= study["speedup_hi"]).all()
    assert (root / "results/tables/study.md").read_text().startswith("| draft")

    for plot in ["acceptance_heatmap.png", "speedup_vs_k.png"]:
        assert (root / "results/plots" / plot).read_bytes()[:4] == b"\x89PNG"
    provenance = yaml.safe_load((root / "results/provenance.yaml").read_text())
    assert {"date", "machine", "packages", "models", "wall_time", "config"} <= set(provenance)
    assert provenance["wall_time"]["decode_jobs"] == 6

    steps = pd.read_parquet(next(root.glob("results/runs/greedy/*/code/k3/seed0/steps.parquet")))
    for column in ["drafted", "accepted", "emitted", "draft_seconds", "verify_seconds", "catchup_seconds"]:
        assert column in steps.columns
    prompts = pd.read_parquet(root / "results/prompts/code.parquet")
    assert set(prompts["source"]) == {"humaneval", "mtbench"} and len(prompts) == 2


def test_complete_run_has_nothing_to_do(tiny_study):
    root, _ = tiny_study
    result = snakemake(root, "--dry-run", "--cores", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert job_counts(result.stdout) == {}, result.stdout[-3000:]


def test_adding_a_k_schedules_only_its_jobs(tiny_study):
    root, config = tiny_study
    more = copy.deepcopy(config)
    more["decoding"]["k"] = config["decoding"]["k"] + [2]
    result = snakemake(root, "--dry-run", "--cores", "1", configfile=write_config(root / "more_k.yaml", more))
    assert result.returncode == 0, result.stderr[-3000:]
    counts = job_counts(result.stdout)
    assert counts["decode"] == len(config["domains"])  # one greedy job per domain for k=2
    assert "prepare_model" not in counts and "make_prompts" not in counts
    assert "k2/seed0" in result.stdout and "k1/seed0/steps" not in result.stdout


def test_adding_a_draft_schedules_only_its_jobs(tiny_study):
    root, config = tiny_study
    more = copy.deepcopy(config)
    more["drafts"] = ["tiny-draft0", "tiny-draft1"]
    result = snakemake(root, "--dry-run", "--cores", "1", configfile=write_config(root / "more_drafts.yaml", more))
    assert result.returncode == 0, result.stderr[-3000:]
    counts = job_counts(result.stdout)
    n_sampled = len(config["decoding"]["sampled"]["k"]) * len(config["decoding"]["sampled"]["seeds"])
    assert counts["prepare_model"] == 1
    assert counts["decode"] == len(config["domains"]) * (len(config["decoding"]["k"]) + n_sampled)
    assert "make_prompts" not in counts
    assert "tiny-draft0/" not in result.stdout.split("Job stats:")[1].split("reason:")[0]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c["decoding"].update(kk=[1]), "kk"),
        (lambda c: c["decoding"].update(k=[0]), "minimum"),
        (lambda c: c["decoding"].update(k="4"), "'4' is not of type 'array'"),
        (lambda c: c["decoding"]["sampled"].update(temperature=-0.5), "temperature"),
        (lambda c: c["decoding"]["sampled"].update(top_p=1.5), "top_p"),
        (lambda c: c.update(drafts=["no-such-model"]), "no-such-model"),
        (lambda c: c["domains"]["code"]["sources"].append({"set": "nope"}), "nope"),
        (lambda c: c["models"]["tiny-target"].update(source="ftp"), "ftp"),
    ],
    ids=["misspelled key", "k < 1", "wrong type", "temperature < 0", "top-p > 1", "unknown draft",
         "unknown prompt set", "unknown source"],
)
def test_invalid_config_is_refused_naming_the_key(tiny_study, mutate, message, tmp_path):
    root, config = tiny_study
    bad = copy.deepcopy(config)
    mutate(bad)
    result = snakemake(root, "--dry-run", "--cores", "1", configfile=write_config(tmp_path / "bad.yaml", bad))
    assert result.returncode != 0
    assert message in result.stdout + result.stderr, (result.stdout + result.stderr)[-3000:]


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
    result = snakemake(root, "--dry-run", "--cores", "1", configfile=write_config(tmp_path / "cuda.yaml", cuda))
    assert result.returncode == 0, result.stderr[-3000:]
    decode_jobs = _job_blocks(result.stdout, "decode")
    assert decode_jobs and all("gpu=1" in b for b in decode_jobs)
