"""What a results table was made from, for its provenance record: package versions, the machine, the models (prepared
directories, or the GGUF files the gguf regime runs), the jobs' wall times (from Snakemake's benchmark files) and
the native kernels' build. Used by the provenance stage (results/provenance.yaml) and by tables made outside the
study's main DAG (the draft sweep's cells)."""

from __future__ import annotations

import collections
import datetime
import hashlib
import json
import os
from pathlib import Path

import pandas as pd

from specdec.fp32.kernel_tables import backend_spans
from specdec.native.build import kernel_build
from .io import read_backend_tables
from .machine import machine_record, package_versions

PACKAGES = ["specdec", "torch", "transformers", "safetensors", "gguf", "accelerate", "snakemake", "pandas",
            "pyarrow", "scipy", "seaborn", "numpy"]


def versions() -> dict:
    return package_versions(PACKAGES)


def job_times(benchmark_files) -> dict:
    seconds = [float(pd.read_csv(f, sep="\t")["s"].iloc[0]) for f in benchmark_files]
    mtimes = [os.path.getmtime(f) for f in benchmark_files]
    first_start = min(m - s for m, s in zip(mtimes, seconds))
    return {"decode_jobs": len(seconds), "decode_job_seconds_sum": round(sum(seconds), 1),
            "decode_span_seconds": round(max(mtimes) - first_start, 1),
            "decode_first_start": datetime.datetime.fromtimestamp(first_start, datetime.UTC).isoformat(),
            "decode_last_end": datetime.datetime.fromtimestamp(max(mtimes), datetime.UTC).isoformat()}


def chosen_backends(kernel_tables) -> dict:
    """Per model (its kernel table's name) and weight shape, the backend each span of row counts runs on."""
    return {Path(path).stem: backend_spans(read_backend_tables(path)) for path in kernel_tables}


def model_record(path) -> dict:
    """A prepared model directory's manifest (the keys that identify it), or a GGUF file's identity and types (the
    gguf regime runs the file itself: its sha256, its layers and the tensor types the quantized kernel ran)."""
    path = Path(path)
    if path.suffix != ".gguf":
        return {k: v for k, v in json.loads((path / "manifest.json").read_text()).items()
                if k in ("source", "num_hidden_layers", "hidden_size", "vocab_size", "parameter_count", "gguf_sha256",
                         "safetensors_sha256")}
    from specdec.gguf.header import read_header
    from specdec.gguf.lean import product_kernel

    header = read_header(path, string_arrays=())
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    arch = header.architecture
    return {"source": "gguf", "gguf_bytes": path.stat().st_size, "gguf_sha256": digest.hexdigest(),
            "architecture": arch, "num_hidden_layers": header.metadata.get(f"{arch}.block_count"),
            "hidden_size": header.metadata.get(f"{arch}.embedding_length"),
            "tensor_types": dict(sorted(collections.Counter(t.qtype for t in header.tensors.values()).items())),
            "product_kernel": product_kernel(), "kernel_plan": kernel_plan_record(path)}


def kernel_plan_record(path, threads: int | None = None) -> dict | None:
    """The kernel plan the file loads with on this machine at `threads` (this process's count unless given; a plan
    is measured per count) (specdec/gguf/kernel_plan.py: measured at its first load and cached), or None where none
    is cached (plans off, a kernel named, or the file never loaded here)."""
    from specdec.gguf import kernel_plan

    plan = kernel_plan.cached_plan(path, threads)
    return None if plan is None else {"label": plan.label(), **plan.as_record()}


def kernel_plan_records(files: dict, threads: int | None = None) -> dict[str, dict | None]:
    """name -> kernel_plan_record of each of a job's GGUF files (each measured on its own: its sessions run its
    plan's kernel)."""
    return {name: kernel_plan_record(path, threads) for name, path in files.items()}


def provenance(config, model_dirs, benchmark_files, threads: int, kernel_tables=()) -> dict:
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine_record(threads),
        "packages": versions(),
        "models": {Path(d).name.removesuffix(".gguf"): model_record(d) for d in model_dirs},
        "wall_time": job_times(benchmark_files),
        # the native kernels' build (hash of their sources and compile flags) the tables were timed on and ran
        "kernel_build": kernel_build(),
        # runtime.linear_kernel auto: the backend every product ran on (more rows than timed: weight_major);
        # invariant: only a bf16 draft's prompt-pass product ("beyond") comes from these tables
        "linear_backends": chosen_backends(kernel_tables),
        "config": config,
    }
