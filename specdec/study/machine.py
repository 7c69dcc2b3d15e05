"""Which machine a measurement comes from: the CPU model, the instruction-set flags that change which kernels run
(AVX2, AVX-512, AVX512-BF16, AMX), the thread count and the torch version, folded into one id that keys the
profiles and cost-model fits (results/machines/{machine}/...), so that a run on a new machine adds its own. On a GPU
(runtime.device cuda) the GPU is the machine: its name, the CUDA version torch was built for and torch's version
(host threads do not change what a GPU step costs)."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

# /proc/cpuinfo flag -> the name in the id, in the order they appear there (strongest last).
KERNEL_FLAGS = {"avx2": "avx2", "avx512f": "avx512", "avx512_bf16": "avx512bf16", "amx_tile": "amx"}


def cpuinfo(path: str | os.PathLike = "/proc/cpuinfo") -> dict:
    """Vendor, model name, family/model numbers and flags of the first CPU (empty values where unknown)."""
    fields: dict[str, str] = {}
    try:
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                break  # the first processor's block is enough
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    except OSError:
        pass
    return {"vendor": fields.get("vendor_id", ""), "model_name": fields.get("model name") or platform.processor(),
            "family": fields.get("cpu family", ""), "model": fields.get("model", ""),
            "flags": fields.get("flags", "").split(), "logical_cpus": os.cpu_count()}


def cpu_slug(info: dict) -> str:
    """A short name for the CPU: its model name without trademarks, 'CPU', clock and core counts; where a VM shows
    only a family name ("AMD EPYC"), the family and model numbers tell generations apart (25-1: Zen 3)."""
    name = re.sub(r"\((r|tm)\)|\bcpu\b|@.*$|\b\d+-core\b|\bprocessor\b", " ", info["model_name"].lower())
    slug = re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "unknown-cpu"
    if len(slug.split("-")) <= 2 and info.get("family"):
        slug += f"-f{info['family']}m{info['model']}"
    return slug


# The CPU generations measured so far, by the start of their machine ids (cpu_slug: vendor, family and model)
CPU_TYPES = {"amd-epyc-f25m1": "AMD EPYC Zen 3", "amd-epyc-f25m17": "AMD EPYC Zen 4",
             "amd-epyc-f26m2": "AMD EPYC Zen 5", "intel-xeon-f6m167": "Intel Xeon (AMX)"}


def cpu_type(machine_id: str) -> str:
    """A machine id's CPU generation as tables name it ('AMD EPYC Zen 4'), or the id itself for one not listed."""
    for prefix, name in CPU_TYPES.items():
        if machine_id.startswith(prefix + "-"):
            return name
    return machine_id


def kernel_flags(info: dict) -> list[str]:
    flags = set(info["flags"])
    return [name for flag, name in KERNEL_FLAGS.items() if flag in flags] or ["baseline-x86" if info["flags"] else
                                                                              platform.machine() or "cpu"]


def gpu_info(device: str = "cuda") -> dict:
    """Name, compute capability, memory and the CUDA version torch was built for, of the GPU `device` names (imports
    torch: asked only where a run is on a GPU). An error where torch sees no such device."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"runtime device is {device!r} but torch sees no CUDA device")
    index = torch.device(device).index or 0
    props = torch.cuda.get_device_properties(index)
    return {"name": props.name, "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1), "cuda": torch.version.cuda or "unknown"}


def gpu_slug(info: dict) -> str:
    """'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^a-z0-9]+", "-", info["name"].lower()).strip("-") or "unknown-gpu"


def _torch_version() -> str:
    """The installed torch's version, read without importing it (the workflow's start-up)."""
    from importlib.metadata import version

    return version("torch").split("+")[0]


def machine_id(threads: int, torch_version: str | None = None, info: dict | None = None, device: str = "cpu",
               gpu: dict | None = None) -> str:
    """e.g. 'amd-epyc-f25m1-avx2-t2-torch2.13.0', 'intel-xeon-platinum-8481c-avx2-avx512-avx512bf16-amx-t2-...'; on a
    GPU (device 'cuda' or 'cuda:N') 'nvidia-h200-cuda13.0-torch2.11.0' (gpu: gpu_info's record, read when None)."""
    torch_version = torch_version or _torch_version()
    if device.startswith("cuda"):
        gpu = gpu or gpu_info(device)
        return f"{gpu_slug(gpu)}-cuda{gpu['cuda']}-torch{torch_version}"
    info = info or cpuinfo()
    return f"{cpu_slug(info)}-{'-'.join(kernel_flags(info))}-t{threads}-torch{torch_version}"


def machine_record(threads: int, device: str = "cpu") -> dict:
    """What provenance records about the machine a run measured on (and its GPU, on one)."""
    info = cpuinfo()
    gpu = gpu_info(device) if device.startswith("cuda") else None
    record = {"id": machine_id(threads, info=info, device=device, gpu=gpu), "cpu": info["model_name"],
              "vendor": info["vendor"], "family": info["family"], "model": info["model"],
              "kernel_flags": kernel_flags(info), "logical_cpus": info["logical_cpus"], "threads": threads,
              "platform": platform.platform(), "python": platform.python_version()}
    return record | ({"device": device, "gpu": gpu} if gpu else {})


def package_versions(names) -> dict:
    """name -> installed version (None where not installed): what provenance records of the software."""
    from importlib import metadata

    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found
