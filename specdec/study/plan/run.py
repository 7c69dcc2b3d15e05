"""What every part of the plan shares: the run's paths (where it writes, where its machine's measurements live), the
path of a model's weights, the settings sections of the config, and the error a refusal raises."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Mapping


class PlanError(ValueError):
    """A job or a config the plan refuses; the message names the draft, the stage or the config key (the workflow
    raises it as Snakemake's WorkflowError)."""


def model_dir(name: str) -> str:
    """A prepared model directory (safetensors, tokenizer, manifest), made by the models stage or a draft's stage."""
    return f"resources/models/{name}"


def gguf_file(name: str) -> str:
    return f"resources/gguf/{name}.gguf"


def gguf_tokenizer_dir(name: str) -> str:
    """A GGUF file's tokenizer, saved once as a tokenizer directory (what the prompts stage reads in the gguf
    regime: the same tokenizer the models stage saves beside the fp32 weights, without converting them)."""
    return f"resources/gguf/{name}.tokenizer"


def one_of(names: Iterable[str], fallback: str) -> str:
    """A wildcard pattern matching exactly these names (a never-matching fallback when there are none)."""
    return "|".join(map(re.escape, names)) or fallback


@dataclass(frozen=True)
class RunPaths:
    """Where a run writes and reads its machine's measurements.

    results: its results_dir, "{machine}" filled in with the machine id (one directory per CPU type); logs and
    benchmarks: logs/<results>/ and benchmarks/<results>/ (logs/ and benchmarks/ themselves for results_dir
    "results"), so that runs never overwrite each other; machines: machines_dir, every machine's profiles and fits;
    machine_dir: this machine's, per engine kernel."""

    machine: str
    results: str
    logs: str
    benchmarks: str
    machines: str
    machine_dir: str

    @classmethod
    def of(cls, config: Mapping, machine: str) -> "RunPaths":
        results = config["results_dir"].replace("{machine}", machine)
        nested = "" if results == "results" else f"/{results}"
        # the gguf regime's quantized kernel has no linear_kernel choice: its fits go under .../gguf
        kernel = "gguf" if config["runtime"]["weights"] == "gguf" else config["runtime"]["linear_kernel"]
        machines = config["machines_dir"]
        return cls(machine=machine, results=results, logs=f"logs{nested}", benchmarks=f"benchmarks{nested}",
                   machines=machines, machine_dir=f"{machines}/{machine}/{kernel}")


@dataclass(frozen=True)
class PlanBase:
    """A validated config (the schema's defaults filled in), the run's paths and the native kernels' build (a hash
    of their sources and flags, which keys the kernel tables: an edited kernel is timed again)."""

    config: Mapping
    paths: RunPaths
    kernel_build: str

    @property
    def gguf(self) -> bool:
        """runtime.weights gguf: every model from its GGUF file on the lean engine (config/gguf.yaml)."""
        return self.config["runtime"]["weights"] == "gguf"

    @property
    def runtime(self) -> Mapping:
        return self.config["runtime"]

    @property
    def decoding(self) -> Mapping:
        return self.config["decoding"]

    @property
    def domains(self) -> list[str]:
        return list(self.config["domains"])

    def section(self, key: str) -> Mapping:
        """An optional section of the config ({} when absent or null)."""
        return self.config.get(key) or {}
