"""bench/gpu_regime.py, the GPU regime's one script, on tiny shapes on the CPU: it must run wherever a GPU is lent
(no chance to debug it there), and its figures must be the ones it claims."""

import json
import runpy
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench/gpu_regime.py"


@pytest.fixture(scope="module")
def script():
    return runpy.run_path(str(SCRIPT))


def test_the_gpu_script_runs_on_tiny_shapes_and_reports_what_it_measured(script, tmp_path):
    args = ["--device", "cpu", "--tiny", "--rows", "4", "--context", "16", "--repeats", "2", "--buffer-mb", "8",
            "--prompts", "2", "--new-tokens", "8", "--k", "3", "--out", str(tmp_path)]
    assert script["main"](args) == 0
    result = json.loads((tmp_path / "gpu_regime.json").read_text())
    assert result["machine"]["threads"] >= 1 and result["rows"] == 4 and result["graphs"] == "off"
    assert set(result["verify_over_step"]) == {"1", "2", "3", "4"} and result["verify_over_step"]["1"] == 1.0
    assert result["differing_rows"]["fixed"] == {"differing": 0, "compared": 20}  # identity by construction
    assert result["greedy_identity"]["identical"] == result["greedy_identity"]["sequences"] == 2
    assert result["step_over_floor"] == pytest.approx(result["target_step_ms"] / result["floor_ms"])
    ratios = result["bytes_ratio"]
    assert 0 < ratios["head_stand_in"] < ratios["0.5b"] < 1 and result["depth_ratio"]["head_stand_in"] == 0.25


def test_the_real_shapes_are_the_random_weights_layers(script):
    shapes = script["architectures"](tiny=False)
    assert shapes["target"]["num_hidden_layers"] == 28 and shapes["draft"]["num_hidden_layers"] == 24
    assert shapes["head"]["num_hidden_layers"] == 1 and shapes["head"]["vocab_size"] == 8192


def test_asking_for_cuda_without_one_is_refused(script, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    with pytest.raises(SystemExit):
        script["main"](["--device", "cuda", "--out", str(tmp_path)])
