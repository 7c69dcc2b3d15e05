"""The stage's settings: config.yaml's `llamacpp:` section over its defaults."""

from __future__ import annotations

# The defaults of config.yaml's `llamacpp:` section (workflow/schemas/config.schema.yaml has the same ones).
DEFAULTS = {
    "package": "llama-cpp-python",
    "version": "0.3.36",
    "sha256": "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    "cmake": "cmake",
    "cc": "cc",
    "cxx": "c++",
    "build_jobs": 2,
    "cmake_flags": [],
    "drafts": None,  # None: the study's drafts that are GGUF models
    "k": None,  # None: decoding.k
    "prompts_per_domain": None,  # None: every prompt of the domain
    "repeats": 1,
    "ctx_size": 4096,
    "repack": True,  # llama.cpp's weight repacking (AMX, AVX-512 layouts); off: --no-repack / --repack 0
    "bench": {"depth": 256, "max_positions": 9, "gen_tokens": 32, "repetitions": 5, "rounds": 2},
}


def settings(config: dict) -> dict:
    """config["llamacpp"] over DEFAULTS (the bench sub-dict merged key by key)."""
    given = dict(config.get("llamacpp") or {})
    out = {**DEFAULTS, **given}
    out["bench"] = {**DEFAULTS["bench"], **(given.get("bench") or {})}
    return out
