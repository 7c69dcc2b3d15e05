"""What the README's commands plan, read off Snakemake dry runs of the real config (no job runs, no model is needed):
- the quick run writes no file that git tracks, so a newcomer's first run leaves a fresh clone clean;
- `--cores 1` plans the same machine id and paths as `--cores 2`: timed jobs run runtime.threads torch threads
  whatever --cores is, which only bounds how many jobs run at once."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import snakemake_runs

REPO = Path(__file__).resolve().parents[1]
QUICK = ("--configfile", "config/quick.yaml")
THREADS_NOTICE = "timed jobs run {threads} torch threads (runtime.threads) one at a time"

# A dry run's CPU is mostly the imports of Snakemake and the Snakefile (tests/snakemake_runs.py pays them once a
# worker): slow tier. The tests that read the --cores 2 plan share one worker and one dry run of it.
ON_QUICK_PLAN = pytest.mark.xdist_group("quick-plan")


def dry_run(*args: str) -> subprocess.CompletedProcess:
    """`snakemake -n` in the checkout, as a user types it; every job of the DAG listed (--forceall), whatever this
    checkout has already made; --nolock: a run in progress here does not stop a dry run."""
    result = snakemake_runs.run(["--dry-run", "--forceall", "--nolock", *args], cwd=REPO)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def planned_files(dry_run_output: str) -> set[str]:
    """The output, log and benchmark paths of every job a dry run lists (a directory output stands for its files)."""
    return {path.strip() for line in dry_run_output.splitlines()
            if line.strip().startswith(("output:", "log:", "benchmark:"))
            for path in line.split(":", 1)[1].split(",")}


@pytest.fixture(scope="module")
def quick_plan_two_cores() -> subprocess.CompletedProcess:
    return dry_run("--cores", "2", *QUICK)


@pytest.mark.slow
@ON_QUICK_PLAN
def test_the_quick_run_writes_no_tracked_file(quick_plan_two_cores):
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split("\0")
    planned = planned_files(quick_plan_two_cores.stdout)
    assert "results/quick/tables/study.csv" in planned, sorted(planned)[:20]  # the plan was read
    written_and_tracked = sorted(f for f in tracked if any(f == p or f.startswith(p.rstrip("/") + "/")
                                                           for p in planned))
    assert written_and_tracked == [], "the quick run would modify committed files"


@pytest.mark.slow
@ON_QUICK_PLAN
def test_one_core_plans_the_machine_and_paths_of_two(quick_plan_two_cores):
    layered = yaml.safe_load((REPO / "config.yaml").read_text())["runtime"] | (
        yaml.safe_load((REPO / "config/quick.yaml").read_text()).get("runtime") or {})
    threads = layered["threads"]
    assert threads >= 2, "with runtime.threads 1, --cores 1 and --cores 2 would agree under any rule"
    one_core = dry_run("--cores", "1", *QUICK)
    planned = planned_files(one_core.stdout)
    assert planned == planned_files(quick_plan_two_cores.stdout)
    machine_dirs = {p.split("/")[3] for p in planned if p.startswith("results/quick/machines/")}
    assert len(machine_dirs) == 1 and f"-t{threads}-" in machine_dirs.pop()  # the machine id names runtime.threads
    # said once, at start, when --cores is below runtime.threads; not at --cores 2 (only when threads is 2)
    assert (one_core.stdout + one_core.stderr).count(THREADS_NOTICE.format(threads=threads)) == 1, one_core.stderr
    assert THREADS_NOTICE.format(threads=threads) not in quick_plan_two_cores.stdout + quick_plan_two_cores.stderr


def test_timed_jobs_take_their_torch_threads_from_runtime_threads():
    # Snakemake caps a job's snakemake.threads at --cores: a script reading it would time on one thread under
    # --cores 1 while the machine id says runtime.threads. Only llama.cpp's build reads it (compiler jobs, untimed).
    readers = sorted(p.name for p in (REPO / "workflow/scripts").glob("*.py")
                     if any("snakemake.threads" in line.split("#")[0] for line in p.read_text().splitlines()))
    assert readers == ["llamacpp_build.py"]


@pytest.mark.slow
def test_the_distribution_check_of_a_feature_head_reads_its_trained_head(tmp_path):
    """experiments/feature-head's distribution check: every (draft, domain) job of the heads loads the trained head
    directory and the target (the check memoises a head by block state: MemoisedHeadDraft)."""
    result = dry_run("--cores", "2", "--configfile", "config/heads.yaml", "experiments/feature-head/config.yaml",
                     "--", "distribution_table")
    lines = result.stdout.splitlines()
    inputs = [next(line for line in lines[i:] if line.strip().startswith("input:"))
              for i, line in enumerate(lines) if line.startswith("rule verify_distribution:")]
    assert len(inputs) == 8  # coder-head and its lookup hybrid, four domains
    assert all("resources/models/coder-head," in line and "resources/models/qwen2.5-coder-1.5b-instruct" in line
               for line in inputs)


@pytest.mark.slow
def test_the_head_trained_on_the_corpus_reads_both_data_sets_and_starts_from_coder_head():
    """experiments/feature-head-corpus: coder-head-corpus's training job reads the answers and the corpus's features
    and coder-head's directory; the corpus's features are read by the target's GGUF file from the corpus table."""
    result = dry_run("--cores", "2", "--configfile", "config/heads.yaml", "experiments/feature-head-corpus/config.yaml",
                     "--", "sweep_cells")
    jobs = re.split(r"\n(?=(?:local)?rule )", result.stdout)

    def job(rule, output):
        """The input paths of the one job of `rule` whose first output is `output`."""
        found = [b for b in jobs if b.startswith(f"rule {rule}:")
                 and b.split("output: ")[1].split(",")[0].split("\n")[0] == output]
        assert len(found) == 1, (rule, output, len(found))
        line = next(line for line in found[0].splitlines() if line.strip().startswith("input:"))
        return set(line.split(":", 1)[1].strip().split(", "))

    inputs = job("train_feature_head", "resources/models/coder-head-corpus")
    assert inputs == {"resources/feature_head/data", "resources/feature_head/corpus_data",
                      "resources/models/coder-head", "resources/models/qwen2.5-coder-1.5b-instruct"}
    assert "resources/feature_head/corpus_data" not in job("train_feature_head", "resources/models/coder-head")
    assert job("feature_head_corpus_data", "resources/feature_head/corpus_data") == {
        "resources/gguf/qwen2.5-coder-1.5b-instruct.gguf", "resources/feature_head/corpus.parquet"}
    corpus = job("feature_head_corpus", "resources/feature_head/corpus.parquet")
    assert {"resources/prompt_sources/writingbench.jsonl", "resources/prompt_sources/longbench_write.jsonl",
            "resources/prompt_sources/humaneval.jsonl.gz", "resources/prompt_sources/mtbench.jsonl"} <= corpus


@pytest.mark.slow
def test_the_dry_run_server_answers_as_snakemake_run_alone_would():
    """tests/snakemake_runs.py forks its dry runs from a process that imported Snakemake once: each must give what
    `python -m snakemake` run alone gives (its exit status, its plan, its error), in the run's own directory and
    environment, or every plan test reads the wrong thing."""
    def alone(args):
        return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=600)

    plan = ["--dry-run", "--forceall", "--nolock", *QUICK]
    served, reference = snakemake_runs.run(plan, cwd=REPO), alone(plan)
    assert served.returncode == reference.returncode == 0, served.stderr[-2000:]
    assert planned_files(served.stdout) == planned_files(reference.stdout) != set()

    wrong = ["--dry-run", "--nolock", *QUICK, "--", "no/such/target.csv"]
    served, reference = snakemake_runs.run(wrong, cwd=REPO), alone(wrong)
    assert served.returncode == reference.returncode != 0
    assert "no/such/target.csv" in served.stdout + served.stderr
    assert served.stderr.strip().splitlines()[-1] == reference.stderr.strip().splitlines()[-1]

    elsewhere = snakemake_runs.run(["--dry-run", "--nolock"], cwd=REPO / "docs")  # no Snakefile there
    assert elsewhere.returncode != 0 and "Snakefile" in elsewhere.stdout + elsewhere.stderr
    named = snakemake_runs.run(plan, cwd=REPO, env={**os.environ, "SPECDEC_MACHINE": "served-machine-id"})
    assert named.returncode == 0 and "machines/served-machine-id/" in named.stdout
