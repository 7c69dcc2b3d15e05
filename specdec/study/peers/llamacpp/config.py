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

# The settings the build reads (the rest are the runs': the build job's params hold only these, so changing how
# llama.cpp runs, `repack` or `bench`, does not build it again; `build_jobs` only sets its speed).
BUILD_KEYS = ("package", "version", "sha256", "cmake", "cc", "cxx", "cmake_flags")


def settings(config: dict) -> dict:
    """config["llamacpp"] over DEFAULTS (the bench sub-dict merged key by key)."""
    given = dict(config.get("llamacpp") or {})
    out = {**DEFAULTS, **given}
    out["bench"] = {**DEFAULTS["bench"], **(given.get("bench") or {})}
    return out


# The defaults of the `vs_llamacpp:` section (our engine next to llama.cpp in one job; config/gguf.yaml sets it).
SIDE_BY_SIDE_DEFAULTS = {
    "drafts": {},  # our draft -> its k (a later layer's null drops it)
    # llama.cpp's draft model (a GGUF model; null: llama.cpp runs plain only) and k
    "llamacpp": {"draft": "qwen2.5-coder-0.5b-instruct", "k": 2},
    "max_new_tokens": 128,
    "prompts_per_domain": {"code": 10, "default": 5},  # a number, a {domain: n, default: n} map, or None: all
    "repeats": 1,
}


def side_by_side_settings(config: dict) -> dict:
    """config["vs_llamacpp"] over SIDE_BY_SIDE_DEFAULTS (llamacpp merged key by key). A draft whose k is null is
    dropped: config layers merge dictionaries, so that is how a layer removes a draft an earlier one named."""
    given = dict(config.get("vs_llamacpp") or {})
    out = {**SIDE_BY_SIDE_DEFAULTS, **given}
    out["llamacpp"] = {**SIDE_BY_SIDE_DEFAULTS["llamacpp"], **(given.get("llamacpp") or {})}
    out["drafts"] = {str(name): int(k) for name, k in (out["drafts"] or {}).items() if k is not None}
    return out


def build_settings(settings_: dict) -> dict:
    """The build's share of `settings(config)` (BUILD_KEYS)."""
    return {key: settings_[key] for key in BUILD_KEYS}
