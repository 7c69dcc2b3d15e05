"""The build's tools: finding cmake and the compilers (one error naming every missing one), and what
they say about themselves for the build manifest."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from .errors import LlamaCppBuildError


def find_tool(name: str, path: str | None = None) -> str | None:
    """The executable `name` (a bare name looked up on PATH, or a path), or None."""
    if os.sep in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    return shutil.which(name, path=path)


def check_toolchain(cmake: str, cc: str, cxx: str, build_log: str | os.PathLike, path: str | None = None) -> dict:
    """{role: resolved path} of cmake and both compilers; LlamaCppBuildError naming every missing one otherwise."""
    wanted = {"cmake": (cmake, "llamacpp.cmake"), "C compiler": (cc, "llamacpp.cc"),
              "C++ compiler": (cxx, "llamacpp.cxx")}
    found, missing = {}, []
    for role, (name, key) in wanted.items():
        resolved = find_tool(name, path)
        if resolved is None:
            where = "not an executable file" if os.sep in name else "not found on PATH"
            missing.append(f"{role} '{name}' ({key}) {where}")
        else:
            found[role] = resolved
    if missing:
        raise LlamaCppBuildError(f"llama.cpp build cannot start: {'; '.join(missing)}; install it (Debian: apt-get "
                                 f"install cmake build-essential) or set the config key to its path; build log: "
                                 f"{build_log}")
    return found


def version_line(tool: str) -> str:
    """The first line a tool prints for --version ("unknown" where it prints none or cannot run)."""
    try:
        res = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except OSError as e:
        return f"unknown ({e})"
    return (res.stdout or res.stderr).strip().splitlines()[0] if (res.stdout or res.stderr).strip() else "unknown"


def native_march(cc: str) -> str | None:
    """What -march=native resolves to for this compiler on this machine (gcc: `-Q --help=target`)."""
    try:
        res = subprocess.run([cc, "-march=native", "-Q", "--help=target"], capture_output=True, text=True, timeout=60,
                             check=False)
    except OSError:
        return None
    m = re.search(r"^\s*-march=\s+(\S+)", res.stdout, re.MULTILINE)
    return m.group(1) if m else None
