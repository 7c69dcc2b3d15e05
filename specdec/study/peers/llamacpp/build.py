"""The CMake build of llama.cpp's CLI tools from the vendored sources of the sdist, with the manifest that
records how they were built (version, commit, flags, compilers, CPU)."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from specdec.study.prepare import wheels
from specdec.study.io import write_text
from specdec.study.machine import cpuinfo
from specdec.study.prepare.wheels import Log
from .errors import LlamaCppBuildError
from .toolchain import check_toolchain, native_march, version_line

# The CLI tools the stage runs; nothing else is built (no server, tests or other examples).
TOOLS = ("llama-completion", "llama-speculative-simple", "llama-bench")

# CMake cache entries of the build: Release, this machine's instruction set, static binaries, no network code.
BASE_CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",  # older llama.cpp: no libcurl downloads (the vendored version has LLAMA_OPENSSL instead)
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",  # llama-completion, llama-bench
    "-DLLAMA_BUILD_EXAMPLES=ON",  # llama-speculative-simple (configured, but only the named targets are built)
    "-DGGML_CCACHE=OFF",
]
MANIFEST = "manifest.json"


def _tool_version(binary: Path) -> str | None:
    """A built tool's own `--version` lines (llama.cpp version, build number, commit, compiler, target)."""
    try:
        res = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return None
    lines = [line for line in (res.stdout + res.stderr).splitlines() if line.startswith(("version:", "built with"))]
    return "; ".join(lines) or None


def vendored_commit(source_root: str | os.PathLike) -> str | None:
    """The llama.cpp commit llama-cpp-python vendors, from the git metadata the sdist ships (no git needed)."""
    root = Path(source_root)
    for head in (root / ".git/modules/vendor/llama.cpp/HEAD", root / "vendor/llama.cpp/.git/HEAD"):
        if head.is_file():
            text = head.read_text().strip()
            if re.fullmatch(r"[0-9a-f]{40}", text):
                return text
    return None


def _run_logged(cmd: Sequence[str], log_file, cwd: str | os.PathLike | None = None) -> int:
    """Run cmd with its stdout and stderr appended to the open text file `log_file`; its exit status."""
    log_file.write(f"$ {shlex.join(cmd)}\n")
    log_file.flush()
    res = subprocess.run(list(cmd), stdout=log_file, stderr=subprocess.STDOUT, cwd=cwd, check=False)
    log_file.flush()
    return res.returncode


def _tail(path: Path, n: int = 3) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def _safe_extract(archive: Path, dest: Path) -> Path:
    """Extract a tar.gz without letting a member escape `dest`; the single top-level directory."""
    with tarfile.open(archive) as tf:
        tf.extractall(dest, filter="data")
    tops = [p for p in dest.iterdir()]
    if len(tops) != 1 or not tops[0].is_dir():
        raise LlamaCppBuildError(f"{archive.name}: expected one top-level directory, found {[p.name for p in tops]}")
    return tops[0]


def build_llamacpp(sdist: str | os.PathLike, out_dir: str | os.PathLike, *, version: str, sha256: str,
                   build_log: str | os.PathLike, cmake: str = "cmake", cc: str = "cc", cxx: str = "c++",
                   jobs: int = 2, extra_flags: Sequence[str] = (), tools: Sequence[str] = TOOLS,
                   path: str | None = None, log: Log = print) -> dict:
    """Build llama.cpp's CLI tools from the vendored sources of the sdist into out_dir/bin, with out_dir/manifest.json.

    The tools are looked up first (nothing is extracted when one is missing). cmake's and the compiler's output go to
    `build_log`; the build tree and sources live in a temporary sibling of out_dir and are removed afterwards; out_dir
    appears only complete (renamed into place). Returns the manifest.
    """
    sdist, out_dir, build_log = Path(sdist), Path(out_dir), Path(build_log)
    tools_found = check_toolchain(cmake, cc, cxx, build_log, path)
    if not sdist.is_file():
        raise LlamaCppBuildError(f"llama.cpp build: source archive {sdist} is missing; build log: {build_log}")
    actual = wheels.sha256_file(sdist)
    if actual != sha256.lower():
        raise LlamaCppBuildError(f"llama.cpp build: {sdist} has sha256 {actual}, the config pins {sha256}; delete it "
                                 f"and rerun; build log: {build_log}")
    flags = [*BASE_CMAKE_FLAGS, f"-DCMAKE_C_COMPILER={tools_found['C compiler']}",
             f"-DCMAKE_CXX_COMPILER={tools_found['C++ compiler']}", *extra_flags]
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    build_log.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.build-", dir=out_dir.parent))
    env_path = path if path is not None else os.environ.get("PATH", "")
    t0 = time.perf_counter()
    try:
        log(f"extracting {sdist.name}")
        root = _safe_extract(sdist, work / "src")
        source = root / "vendor" / "llama.cpp"
        if not (source / "CMakeLists.txt").is_file():
            raise LlamaCppBuildError(f"llama.cpp build: {sdist.name} has no vendor/llama.cpp/CMakeLists.txt; build "
                                     f"log: {build_log}")
        build = work / "build"
        with open(build_log, "a") as blog:
            blog.write(f"# llama.cpp {version} build, {_dt.datetime.now(_dt.UTC).isoformat()}\n")
            steps = [("configure", [tools_found["cmake"], "-S", str(source), "-B", str(build), *flags]),
                     ("build", [tools_found["cmake"], "--build", str(build), "--config", "Release", "-j", str(jobs),
                                "--target", *tools])]
            for step, cmd in steps:
                log(f"cmake {step}: {shlex.join(cmd)}")
                old_path = os.environ.get("PATH")
                os.environ["PATH"] = env_path
                try:
                    status = _run_logged(cmd, blog)
                finally:
                    if old_path is not None:
                        os.environ["PATH"] = old_path
                if status != 0:
                    blog.close()
                    raise LlamaCppBuildError(f"llama.cpp build failed at cmake {step} (exit {status}): "
                                             f"{_tail(build_log)}; build log: {build_log}")
        staging = work / "out"
        (staging / "bin").mkdir(parents=True)
        for tool in tools:
            binary = build / "bin" / tool
            if not binary.is_file():
                raise LlamaCppBuildError(f"llama.cpp build: {tool} was not produced; build log: {build_log}")
            shutil.copy2(binary, staging / "bin" / tool)
        for lic in ("LICENSE",):
            if (source / lic).is_file():
                shutil.copy2(source / lic, staging / "LICENSE.llama.cpp")
        cache = (build / "CMakeCache.txt").read_text(errors="replace") if (build / "CMakeCache.txt").is_file() else ""
        cpu = cpuinfo()
        ggml_flags = re.findall(r"Adding CPU backend variant ggml-cpu: (.*)", build_log.read_text(errors="replace"))
        manifest = {
            "package": "llama-cpp-python",
            "version": version,
            "sdist": sdist.name,
            "sdist_sha256": actual,
            "llama_cpp_commit": vendored_commit(root),
            "cmake_flags": flags,
            "built_tools": list(tools),
            "cmake": version_line(tools_found["cmake"]),
            "c_compiler": version_line(tools_found["C compiler"]),
            "cxx_compiler": version_line(tools_found["C++ compiler"]),
            "ggml_cpu_variant_flags": ggml_flags[-1].strip() if ggml_flags else None,
            "cmake_cxx_flags_release": (re.search(r"^CMAKE_CXX_FLAGS_RELEASE:STRING=(.*)$", cache, re.MULTILINE) or
                                        [None, None])[1],
            "native_march": native_march(tools_found["C compiler"]),
            "tool_version": _tool_version(staging / "bin" / tools[0]),
            "cpu_model": cpu["model_name"] or "unknown",
            "cpu_flags": cpu["flags"],
            "machine": platform.machine(),
            "build_seconds": round(time.perf_counter() - t0, 1),
            "built": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        }
        write_text(json.dumps(manifest, indent=2) + "\n", staging / MANIFEST)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"built {', '.join(tools)} in {manifest['build_seconds']} s into {out_dir}")
    return manifest


def read_build_manifest(build_dir: str | os.PathLike) -> dict:
    return json.loads((Path(build_dir) / MANIFEST).read_text())
