"""The workflow in the gguf regime (runtime.weights: gguf): the tiny study run end to end from tiny GGUF files (every
kind that runs there, greedy identity with 0 near-ties and 0 divergences, reproduce, provenance naming the files), a
dry run of config/gguf.yaml over the real config (GGUF files and their tokenizer in, no model directory, no kernel
table, no profile), and the refusals at start or when a stage that does not run there is
asked for, each naming what it refuses."""

import copy
import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

import snakemake_runs
from specdec.testing import build_tiny_gguf_study, tiny_gguf_with_tokenizer

pytestmark = pytest.mark.slow
# the tests on the module's tiny study run on one xdist worker, so that its fixture is built once
ON_GGUF_STUDY = pytest.mark.xdist_group("tiny-gguf-study")
REPO = Path(__file__).resolve().parents[1]


def snakemake(workdir: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return snakemake_runs.run(["--snakefile", REPO / "Snakefile", "--directory", workdir,
                               "--configfile", workdir / "config.yaml", *args],
                              env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=timeout)


def tiny_gguf_config(root: Path) -> dict:
    """One domain, greedy at k 3 only: every kind of the regime (a model draft, a cut of the target's file, an early
    exit, lookup, the hybrid) in five decode jobs."""
    config = build_tiny_gguf_study(root, k=[3])
    config["domains"] = {"code": config["domains"]["code"]}
    config["decoding"]["sampled"] = None
    write(root, config)
    return config


def write(root: Path, config: dict) -> None:
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


@pytest.fixture(scope="module")
def gguf_study(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-gguf-study")
    config = tiny_gguf_config(root)
    result = snakemake(root, "--cores", "2", "--set-threads", "decode=1", "reproduce_decode=1", "--", "all",
                       "reproduce")
    assert result.returncode == 0, result.stderr[-4000:]
    return root, config


@ON_GGUF_STUDY
def test_the_tiny_study_runs_from_gguf_files_with_greedy_identity_and_no_near_tie(gguf_study):
    root, config = gguf_study
    identity = pd.read_csv(root / "results/tables/greedy_identity.csv")
    assert set(identity["draft"]) == set(config["drafts"])
    assert (identity["n_identical"] == identity["n_sequences"]).all() and (identity["n_sequences"] > 0).all()
    assert (identity["n_near_tie"] == 0).all() and (identity["n_divergent"] == 0).all()
    for draft in config["drafts"]:
        steps = pd.read_parquet(root / f"results/runs/greedy/{draft}/code/k3/seed0/steps.parquet")
        assert steps["kernel"].str.startswith("gguf-").all(), draft  # every target pass on the quantized engine
        spec = steps[steps["method"] == "speculative"]
        assert spec["drafted"].sum() > 0, draft
        if draft != "lookup":  # a model draft's steps ran on the quantized engine too
            assert spec[spec["drafted"] > 0]["draft_kernel"].str.startswith("gguf-").any(), draft
    # no fp32 weights anywhere: no model directory was prepared, the prompts came from the target file's tokenizer
    assert not (root / "resources/models").exists()
    assert (root / "resources/gguf/tiny-target.tokenizer/tokenizer_config.json").is_file()
    reproduce = pd.read_csv(root / "results/tables/reproduce.csv")
    assert reproduce["same_tokens"].all()
    provenance = yaml.safe_load((root / "results/provenance.yaml").read_text())
    assert set(provenance["models"]) == {"tiny-target", "tiny-draft0"}
    record = provenance["models"]["tiny-target"]
    assert record["source"] == "gguf" and record["num_hidden_layers"] == 2 and len(record["gguf_sha256"]) == 64
    assert set(record["tensor_types"]) == {"F32", "Q4_K", "Q6_K"} and record["product_kernel"].startswith("gguf-")
    assert provenance["config"]["runtime"]["weights"] == "gguf"


@ON_GGUF_STUDY
def test_a_second_run_has_nothing_to_do(gguf_study):
    root, _ = gguf_study
    result = snakemake(root, "-n", "--cores", "2", "--", "all", "reproduce")
    assert result.returncode == 0 and "Nothing to be done" in result.stdout + result.stderr


@pytest.mark.parametrize("change, words", [
    (lambda c: c["draft_kinds"].update(dist={"kind": "distilled", "model": "tiny-draft0", "layers": 1})
     or c["drafts"].append("dist"), ["draft 'dist'", "'distilled'", "no GGUF file"]),
    (lambda c: c["draft_kinds"]["hybrid"].update(dtype="bfloat16"), ["draft 'hybrid'", "dtype 'bfloat16'"]),
    (lambda c: c["models"].update({"tiny-draft9": dict(c["models"]["tiny-draft0"])}) or c["drafts"].append(
        "tiny-draft9"), ["'tiny-draft9'", "resources/gguf/tiny-draft9.gguf", "does not exist"]),
    (lambda c: c["runtime"].update(dtype="bfloat16"), ["dtype must be 'float32'"]),
])
def test_what_cannot_run_in_the_regime_is_refused_at_start_by_name(tmp_path, change, words):
    config = tiny_gguf_config(tmp_path)
    change(config)
    write(tmp_path, config)
    result = snakemake(tmp_path, "-n", "--cores", "1", timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and all(word in output for word in words), output[-3000:]
    assert "Job stats" not in output  # before any plan


@pytest.mark.parametrize("target, rule", [("peers", "peers_run"), ("roofline", "roofline_kernels")])
@ON_GGUF_STUDY
def test_a_stage_that_runs_hugging_face_models_is_refused_when_asked_for(gguf_study, tmp_path, target, rule):
    root, config = gguf_study
    write(tmp_path, copy.deepcopy(config) | {"profiling": {"repeats": 1}})
    shutil.copytree(root / "resources", tmp_path / "resources")
    shutil.copytree(root / "src", tmp_path / "src")
    result = snakemake(tmp_path, "-n", "--cores", "1", "--", target, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and rule in output and "runtime.weights 'gguf'" in output, output[-3000:]


@ON_GGUF_STUDY
def test_the_machine_target_profiles_the_gguf_files_and_joins_the_verdict_as_its_own_kernel(gguf_study, tmp_path):
    """`machine` in the regime: lean sessions over the target's file, a draft's and a cut of the target's file (and
    a wider file, profiling.extra_models: the fit needs two widths) profiled per layer, fitted, kept under
    {machine}/gguf/ and read by the verdict across machines."""
    root, config = gguf_study
    config = copy.deepcopy(config)
    shutil.copytree(root / "resources", tmp_path / "resources")
    tiny_gguf_with_tokenizer(tmp_path / "resources/gguf/tiny-wide.gguf", layers=1, hidden=512, ffn=1024, heads=8)
    config["models"]["tiny-wide"] = dict(config["models"]["tiny-target"])  # only its GGUF file is read here
    config["profiling"] = {"context_length": 16, "repeats": 2, "warmup": 1, "n_boot": 50, "extra_models": ["tiny-wide"]}
    write(tmp_path, config)
    result = snakemake(tmp_path, "--cores", "1", "--", "machine", timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    machine_dir, = (tmp_path / "results/machines").glob("*/gguf")
    profiles = {p.stem: pd.read_csv(p) for p in (machine_dir / "profiles").glob("*.csv")}
    assert set(profiles) == {"tiny-target", "tiny-draft0", "trunc1", "tiny-wide"}
    assert profiles["trunc1"]["n_layers"].iloc[0] == 1 and profiles["tiny-target"]["n_layers"].iloc[0] == 2
    assert (profiles["tiny-target"]["dtype_bytes"] < 1).all() and "head_dtype_bytes" in profiles["tiny-target"]
    layers = profiles["tiny-target"].query("component == 'layer'")
    assert set(layers["layer"]) == {0, 1} and (layers["seconds"] > 0).all()
    fitted = pd.read_csv(machine_dir / "fitted_drafts_c.csv").set_index("draft")
    assert fitted.loc["trunc1", "c_measured_by"] == "profile" and fitted.loc["early1", "c_measured_by"] == "profile"
    machines = pd.read_csv(tmp_path / "results/tables/machines.csv")
    assert (machines["kernel"] == "gguf").any()


def test_config_gguf_plans_the_study_from_the_gguf_files():
    """config/gguf.yaml over the real config, as README says to run it: every decode job reads the target's GGUF
    file (a model draft's and a cut's too), the prompts the target file's tokenizer; nothing loads or times fp32
    weights (the distribution check runs the GGUF sessions, the machine's profiles the GGUF files); the default
    target audits the cost model against the decode runs; nothing is written outside results/study-gguf/,
    resources/ and this machine's gguf fit."""
    result = snakemake_runs.run(["--dry-run", "--forceall", "--nolock", "--cores", "2", "--configfile",
                                 "config/gguf.yaml"], cwd=REPO)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    lines = output.splitlines()
    rules = {line.split()[1].rstrip(":") for line in lines if line.startswith(("rule ", "localrule "))}
    assert {"decode", "gguf_tokenizer", "make_prompts", "verify_greedy", "verify_distribution", "study_table",
            "provenance", "profile_fit_models", "costmodel", "machine_fit"} <= rules
    assert not rules & {"prepare_model", "derive_truncated_draft", "time_linear_backends", "time_bf16_products",
                        "peers_run"}
    profiled = [line for line in lines if line.strip().startswith("input:") and "profiles" not in line
                and "resources/gguf/qwen2.5-coder-1.5b-instruct.gguf" in line and "prompts" not in line]
    assert profiled  # the fit's profiles read the GGUF files
    inputs = [line.split(":", 1)[1] for line in lines if line.strip().startswith("input:")]
    assert inputs and not any("resources/models/" in line or "/kernels/" in line for line in inputs)
    decode_inputs = [line for line in inputs if "/prompts/" in line and ".parquet" in line and "gguf" in line]
    assert decode_inputs and all("resources/gguf/qwen2.5-coder-1.5b-instruct.gguf" in line for line in decode_inputs)
    assert any("resources/gguf/qwen2.5-coder-0.5b-instruct.gguf" in line for line in decode_inputs)
    outputs = {p.strip() for line in lines if line.strip().startswith("output:")
               for p in line.split(":", 1)[1].split(",")}
    assert "results/study-gguf/tables/greedy_identity.csv" in outputs
    machine_dir = "results/machines/"  # the default machines_dir: the fit beside the fp32 ones, kernel gguf
    assert all(p.startswith(("results/study-gguf/", "resources/")) or (p.startswith(machine_dir) and "/gguf/" in p)
               for p in outputs), sorted(outputs)[:10]
    assert "results/study-gguf/tables/costmodel.csv" in outputs
