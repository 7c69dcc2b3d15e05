"""The machine id that keys profiles and fits: a CPU's model, kernel flags, threads and torch; a GPU's name and CUDA."""

import pytest
import torch

from specdec.study import machine

ZEN4 = {"vendor": "AuthenticAMD", "model_name": "AMD EPYC", "family": "25", "model": "17",
        "flags": ["avx2", "avx512f", "avx512_bf16"], "logical_cpus": 2}
H200 = {"name": "NVIDIA H200", "capability": "9.0", "memory_gib": 139.8, "cuda": "13.0"}


def test_a_cpu_id_names_the_generation_the_kernel_flags_threads_and_torch():
    assert machine.machine_id(2, "2.13.0", ZEN4) == "amd-epyc-f25m17-avx2-avx512-avx512bf16-t2-torch2.13.0"
    assert machine.machine_id(1, "2.13.0", ZEN4) != machine.machine_id(2, "2.13.0", ZEN4)


def test_a_gpu_id_names_the_gpu_and_cuda_not_the_host():
    gpu_id = machine.machine_id(2, "2.11.0", ZEN4, device="cuda", gpu=H200)
    assert gpu_id == "nvidia-h200-cuda13.0-torch2.11.0"
    # host threads and CPU do not enter a GPU's id; the device index does not either (same kind of GPU)
    assert machine.machine_id(8, "2.11.0", {**ZEN4, "model": "1"}, device="cuda:1", gpu=H200) == gpu_id


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_asking_for_a_gpu_without_one_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no CUDA device"):
        machine.machine_id(2, "2.13.0", ZEN4, device="cuda")
    with pytest.raises(RuntimeError, match="no CUDA device"):
        machine.machine_record(2, device="cuda")


def test_a_cpu_record_has_no_gpu_fields():
    record = machine.machine_record(2)
    assert record["threads"] == 2 and "gpu" not in record
    assert record["id"].endswith("-t2-torch" + torch.__version__.split("+")[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU here")
def test_a_gpu_record_names_the_gpu():
    record = machine.machine_record(2, device="cuda")
    assert record["gpu"]["name"] == torch.cuda.get_device_name(0)
    assert record["id"].startswith(machine.gpu_slug(record["gpu"]))


def test_a_machine_id_names_its_cpu_generation_and_an_unknown_one_keeps_its_id():
    assert machine.cpu_type("amd-epyc-f25m1-avx2-t2-torch2.13.0") == "AMD EPYC Zen 3"
    assert machine.cpu_type(machine.machine_id(2, "2.13.0", ZEN4)) == "AMD EPYC Zen 4"
    assert machine.cpu_type("some-new-cpu-avx2-t2-torch2.13.0") == "some-new-cpu-avx2-t2-torch2.13.0"
