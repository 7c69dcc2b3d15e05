"""What the llama.cpp stage raises: one class per way it fails (build, run, parse)."""

from __future__ import annotations


class LlamaCppError(RuntimeError):
    """Something the llama.cpp stage needs is missing or failed."""


class LlamaCppBuildError(LlamaCppError):
    """The build cannot run (a tool is missing) or failed. str() is one line: what, and where the build log is."""


class LlamaCppRunError(LlamaCppError):
    """A llama.cpp tool exited non-zero or printed something the parser does not recognise."""


class LlamaCppParseError(LlamaCppRunError, ValueError):
    """A llama.cpp tool's output lacks a counter the stage needs."""
