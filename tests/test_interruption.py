"""Interrupted runs: kill the workflow in the middle of its decoding jobs (SIGINT, then SIGKILL), rerun, and check
that nothing half-written is left, finished jobs are not redone, and the tables equal an uninterrupted run's."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from specdec.testing import build_tiny_study

REPO = Path(__file__).resolve().parents[1]
DETERMINISTIC = ["draft", "domain", "k", "temperature", "acceptance", "tokens_per_pass", "n_prompts", "n_repeats"]


def _cmd(root: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(root),
            "--configfile", str(root / "config.yaml"), "--cores", "1", *args]


def _small_study(root: Path) -> None:
    config = build_tiny_study(root, k=[1, 3])
    config["domains"] = {"code": config["domains"]["code"]}
    config["decoding"]["sampled"] = None
    config["decoding"]["max_new_tokens"] = 16
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def _run_until_first_decode_output(root: Path) -> subprocess.Popen:
    """Start the workflow in its own process group; return once one decode job has finished and another runs."""
    proc = subprocess.Popen(_cmd(root), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.time() + 600
    while time.time() < deadline:
        done = list(root.glob("results/runs/**/sequences.parquet"))
        started = list(root.glob("logs/decode/**/*.log"))
        # With one core the next decode job starts only once Snakemake has registered the previous one as done.
        if done and len(started) > len(done):
            time.sleep(1)
            return proc
        if proc.poll() is not None:
            pytest.fail(f"workflow ended before it could be interrupted: {proc.stderr.read()[-2000:]}")
        time.sleep(0.5)
    proc.kill()
    pytest.fail("no decode job finished within 10 minutes")


def _parquet_files_are_whole(root: Path) -> None:
    for path in root.glob("results/**/*.parquet"):
        pd.read_parquet(path)  # raises on a truncated file


def _mtimes(root: Path) -> dict[Path, float]:
    return {p: p.stat().st_mtime for p in root.glob("results/runs/**/*.parquet")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("uninterrupted")
    _small_study(root)
    result = subprocess.run(_cmd(root), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return pd.read_csv(root / "results/tables/study.csv")[DETERMINISTIC]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_interrupted_run_resumes_without_loss(tmp_path, reference, sig):
    _small_study(tmp_path)
    proc = _run_until_first_decode_output(tmp_path)
    os.killpg(proc.pid, sig)  # the whole group: Snakemake and its running job
    proc.wait(timeout=120)
    _parquet_files_are_whole(tmp_path)
    finished = _mtimes(tmp_path)
    assert finished, "at least one decode job had finished before the interruption"
    assert not (tmp_path / "results/tables/study.csv").exists()

    if sig == signal.SIGKILL:  # a killed Snakemake leaves its lock behind; README: unlock, then rerun
        subprocess.run(_cmd(tmp_path, "--unlock"), capture_output=True, check=True)
    result = subprocess.run(_cmd(tmp_path, "--rerun-incomplete"), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    _parquet_files_are_whole(tmp_path)
    after = _mtimes(tmp_path)
    assert {p: after[p] for p in finished} == finished, "finished jobs were redone"
    assert len(after) > len(finished)
    resumed = pd.read_csv(tmp_path / "results/tables/study.csv")[DETERMINISTIC]
    pd.testing.assert_frame_equal(resumed, reference)
