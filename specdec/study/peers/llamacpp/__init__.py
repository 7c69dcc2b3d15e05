"""llama.cpp next to the study: built from a pinned PyPI source package, run on the study's own GGUF files and
prompts, plain and speculative decoding timed in one process per (draft, domain), and the cost questions asked of
that regime. No Snakemake in here: the rules in workflow/rules/llamacpp.smk call these functions.

- Source: the ``llama-cpp-python`` sdist vendors llama.cpp under ``vendor/llama.cpp``; it is fetched once with pip
  (``wheels.fetch_archives(..., sdist=True)``), checked against the sha256 pinned in config.yaml, and never installed.
- Build (``build_llamacpp``): CMake, Release, ``GGML_NATIVE`` (the flags of the building machine), static, only the
  CLI tools the stage runs; the binaries and a ``manifest.json`` (version, vendored llama.cpp commit, CMake flags,
  compiler, CPU flags) go to ``resources/llamacpp/<version>/``. A missing tool or a failed step raises
  ``LlamaCppBuildError`` whose message is one line naming what is missing and where the build log is.
- Runs: ``llama-completion`` (plain greedy) and ``llama-speculative-simple`` (draft model, greedy verification) with
  ``--log-jsonl``: every token either tool emits is one log entry of its own, so the generated text comes back
  token by token and two runs can be compared position by position.
- Costs: ``llama-bench`` token generation (one step) and prompt processing of m = 1..9 positions at a KV depth
  (the verify pass), per model; the bytes a step reads from the GGUF tensor table (``gguf`` package).

One module per job: config (the settings and their defaults), errors, source (the pinned sdist), toolchain (cmake and
the compilers), build (the CMake build and its manifest), commands (the tools' command lines), parse (their output),
runs (the decode and bench jobs), gguf_files (GGUF facts and export), costs (step costs and the predicted speedup),
table (the stage's table). Every public name is re-exported here: callers write ``llamacpp.<name>``.
"""

from __future__ import annotations

from specdec.study.verify.divergence import first_difference
from specdec.study.prepare.wheels import Log
from .build import BASE_CMAKE_FLAGS, MANIFEST, TOOLS, build_llamacpp, read_build_manifest, vendored_commit
from .commands import RunSettings, bench_command, plain_command, speculative_command, write_prompt
from .config import BUILD_KEYS, DEFAULTS, SIDE_BY_SIDE_DEFAULTS, build_settings, settings, side_by_side_settings
from .costs import cost_seconds, predicted_llamacpp_speedup, step_costs
from .errors import LlamaCppBuildError, LlamaCppError, LlamaCppParseError, LlamaCppRunError
from .gguf_files import export_gguf, gguf_facts
from .parse import CLOSING, JsonlLog, parse_bench, parse_plain, parse_speculative, read_jsonl_log
from .runs import PLAIN, bench_job, decode_job, decode_run, run_tool
from .source import fetch_source, sdist_name
from .table import TABLE_COLUMNS, engine_scale, engine_speeds, summarize
from .toolchain import check_toolchain, find_tool

__all__ = [
    "BASE_CMAKE_FLAGS", "BUILD_KEYS", "CLOSING", "DEFAULTS", "MANIFEST", "PLAIN", "TABLE_COLUMNS", "TOOLS",
    "JsonlLog", "Log", "LlamaCppBuildError", "LlamaCppError", "LlamaCppParseError", "LlamaCppRunError",
    "RunSettings", "bench_command", "bench_job", "build_llamacpp", "build_settings", "check_toolchain",
    "cost_seconds", "decode_job", "engine_scale", "engine_speeds", "export_gguf", "fetch_source", "find_tool",
    "first_difference", "gguf_facts", "parse_bench", "parse_plain", "parse_speculative", "plain_command",
    "predicted_llamacpp_speedup", "read_build_manifest", "read_jsonl_log", "run_tool", "sdist_name", "settings",
    "side_by_side_settings", "SIDE_BY_SIDE_DEFAULTS", "speculative_command", "step_costs", "summarize",
    "vendored_commit", "write_prompt", "decode_run",
]
