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

What each parsed counter means, and the source file it comes from (llama.cpp as vendored by llama-cpp-python 0.3.36):

- ``examples/speculative-simple/speculative-simple.cpp``: ``decoded N tokens in S seconds`` (N = n_predict, S = the
  decode loop from after the prompt prefill to the end: draft, verify, sampling, KV bookkeeping); ``n_drafted`` (sum
  of the sizes of the drafts that were verified), ``n_accept`` (draft tokens the target's greedy choice agreed with),
  ``n_predict`` (tokens emitted, including each pass's own target token; the loop may run one token past -n).
- ``common/speculative.cpp`` (``common_speculative_print_stats``, trace level ``-lv 4``): ``#calls(b,g,a)`` (begin,
  draft, accept calls: one accept call per verify pass), ``#gen drafts``/``#acc drafts`` (drafts made / drafts with at
  least one token accepted), ``#gen tokens``/``#acc tokens`` (draft tokens proposed / accepted), ``#mean acc len`` =
  1 + acc tokens / accept calls (tokens emitted per target verify pass), ``#acc rate/pos`` (share of passes whose
  i-th draft token was accepted), ``dur(b,g,a)`` (milliseconds spent in begin, draft generation, accept).
- ``src/llama-context.cpp`` (``llama_perf_context_print``): ``prompt eval time`` (decode calls of more than one token:
  the prompt, and in speculative runs the verify passes), ``eval time ... runs`` (one-token decode calls: plain
  decoding's steps); ``common/sampling.cpp`` (``common_perf_print``): ``sampling time`` per sampled token.
- ``tools/llama-bench/llama-bench.cpp`` (``-o jsonl``): per test ``n_prompt``, ``n_gen``, ``n_depth``, ``samples_ns``
  (one wall time per repetition: a pp test is one decode of n_prompt positions, a tg test n_gen one-token decodes,
  both after an untimed prefill of n_depth positions), ``avg_ns``, ``build_commit``, ``cpu_info``, ``n_threads``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from . import wheels
from .io import write_text

Log = Callable[[str], None]

# --------------------------------------------------------------------------------------------------- settings
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


def settings(config: dict) -> dict:
    """config["llamacpp"] over DEFAULTS (the bench sub-dict merged key by key)."""
    given = dict(config.get("llamacpp") or {})
    out = {**DEFAULTS, **given}
    out["bench"] = {**DEFAULTS["bench"], **(given.get("bench") or {})}
    return out


def sdist_name(package: str, version: str) -> str:
    """The file name pip gives a (PEP 625) source archive: `llama_cpp_python-0.3.36.tar.gz`."""
    return f"{re.sub(r'[-_.]+', '_', package).lower()}-{version}.tar.gz"


# --------------------------------------------------------------------------------------------------- errors
class LlamaCppError(RuntimeError):
    """Something the llama.cpp stage needs is missing or failed."""


class LlamaCppBuildError(LlamaCppError):
    """The build cannot run (a tool is missing) or failed. str() is one line: what, and where the build log is."""


class LlamaCppRunError(LlamaCppError):
    """A llama.cpp tool exited non-zero or printed something the parser does not recognise."""


class LlamaCppParseError(LlamaCppRunError, ValueError):
    """A llama.cpp tool's output lacks a counter the stage needs."""


# --------------------------------------------------------------------------------------------------- source
def fetch_source(package: str, version: str, sha256: str, download_dir: str | os.PathLike, dest: str | os.PathLike,
                 log: Log = print) -> Path:
    """The pinned source archive at `dest`: fetched once with pip (sdist, never built or installed; an archive already
    in download_dir or SPECDEC_WHEEL_CACHE is reused) and checked against `sha256`."""
    archive = wheels.fetch_archives([(package, version)], download_dir, log, sdist=True)[0]
    actual = wheels.sha256_file(archive)
    if actual != sha256.lower():
        raise LlamaCppError(f"{archive} has sha256 {actual}, config pins {sha256} for {package}=={version}: the "
                            f"download is corrupt or the pin is wrong; delete the file and rerun")
    dest = Path(dest)
    if archive.resolve() != dest.resolve():
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(archive, dest)
    log(f"{package}=={version}: {dest} ({dest.stat().st_size} bytes), sha256 ok")
    return dest


# --------------------------------------------------------------------------------------------------- build
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


def _version_line(tool: str) -> str:
    try:
        res = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except OSError as e:
        return f"unknown ({e})"
    return (res.stdout or res.stderr).strip().splitlines()[0] if (res.stdout or res.stderr).strip() else "unknown"


def _native_march(cc: str) -> str | None:
    """What -march=native resolves to for this compiler on this machine (gcc: `-Q --help=target`)."""
    try:
        res = subprocess.run([cc, "-march=native", "-Q", "--help=target"], capture_output=True, text=True, timeout=60,
                             check=False)
    except OSError:
        return None
    m = re.search(r"^\s*-march=\s+(\S+)", res.stdout, re.MULTILINE)
    return m.group(1) if m else None


def _tool_version(binary: Path) -> str | None:
    """A built tool's own `--version` lines (llama.cpp version, build number, commit, compiler, target)."""
    try:
        res = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return None
    lines = [line for line in (res.stdout + res.stderr).splitlines() if line.startswith(("version:", "built with"))]
    return "; ".join(lines) or None


def cpu_flags(path: str | os.PathLike = "/proc/cpuinfo") -> list[str]:
    """The instruction-set flags of the first CPU in /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return []
    m = re.search(r"^flags\s*:\s*(.*)$", text, re.MULTILINE)
    return m.group(1).split() if m else []


def cpu_model(path: str | os.PathLike = "/proc/cpuinfo") -> str:
    try:
        m = re.search(r"^model name\s*:\s*(.*)$", Path(path).read_text(), re.MULTILINE)
    except OSError:
        m = None
    return m.group(1).strip() if m else platform.processor() or "unknown"


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
        ggml_flags = re.findall(r"Adding CPU backend variant ggml-cpu: (.*)", build_log.read_text(errors="replace"))
        manifest = {
            "package": "llama-cpp-python",
            "version": version,
            "sdist": sdist.name,
            "sdist_sha256": actual,
            "llama_cpp_commit": vendored_commit(root),
            "cmake_flags": flags,
            "built_tools": list(tools),
            "cmake": _version_line(tools_found["cmake"]),
            "c_compiler": _version_line(tools_found["C compiler"]),
            "cxx_compiler": _version_line(tools_found["C++ compiler"]),
            "ggml_cpu_variant_flags": ggml_flags[-1].strip() if ggml_flags else None,
            "cmake_cxx_flags_release": (re.search(r"^CMAKE_CXX_FLAGS_RELEASE:STRING=(.*)$", cache, re.MULTILINE) or
                                        [None, None])[1],
            "native_march": _native_march(tools_found["C compiler"]),
            "tool_version": _tool_version(staging / "bin" / tools[0]),
            "cpu_model": cpu_model(),
            "cpu_flags": cpu_flags(),
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


# --------------------------------------------------------------------------------------------------- command lines
@dataclass(frozen=True)
class RunSettings:
    threads: int
    max_new_tokens: int
    ctx_size: int = 4096
    seed: int = 0
    repack: bool = True  # False: --no-repack (llama.cpp 0.3.36's AMX repack crashes on passes over 2+ positions)


def _common_args(model: str | os.PathLike, prompt_file: str | os.PathLike, s: RunSettings) -> list[str]:
    # --log-jsonl: one JSON object per log entry on stdout, every emitted token its own entry.
    # --no-escape: the prompt file is the chat-templated text as is (no "\n" unescaping); greedy: --temp 0.
    # The prompt file must end with one extra "\n": -f drops a final newline (common/arg.cpp), see write_prompt.
    return ["-m", str(model), "-f", str(prompt_file), "-n", str(s.max_new_tokens), "-t", str(s.threads),
            "-tb", str(s.threads), "-c", str(s.ctx_size), "--temp", "0", "--seed", str(s.seed), "--no-escape",
            "--log-jsonl", *([] if s.repack else ["--no-repack"])]


def write_prompt(text: str, path: str | os.PathLike) -> Path:
    """The prompt file for -f: llama.cpp's -f strips one trailing newline (common/arg.cpp), and a chat-templated
    prompt ends in one ("<|im_start|>assistant\n"), so one more is written to keep the text exactly."""
    path = Path(path)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def plain_command(bin_dir: str | os.PathLike, model, prompt_file, s: RunSettings) -> list[str]:
    """Plain greedy decoding: llama-completion, no conversation mode (the prompt already carries the chat template),
    the prompt not echoed but its token ids logged (--verbose-prompt)."""
    return [str(Path(bin_dir) / "llama-completion"), *_common_args(model, prompt_file, s), "-no-cnv",
            "--no-display-prompt", "--verbose-prompt"]


def speculative_command(bin_dir: str | os.PathLike, model, draft, prompt_file, k: int, s: RunSettings) -> list[str]:
    """Speculative greedy decoding with a draft model: llama-speculative-simple with the draft-simple implementation,
    k drafted tokens per pass (--spec-draft-n-max k, --spec-draft-p-min 0: no early stop on low draft confidence;
    fewer only where the -n budget has fewer left), the draft on the same threads; -lv 4 prints
    common_speculative_print_stats (trace level)."""
    return [str(Path(bin_dir) / "llama-speculative-simple"), *_common_args(model, prompt_file, s),
            "-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(k),
            "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-td", str(s.threads), "-tbd", str(s.threads),
            "-lv", "4"]


def bench_command(bin_dir: str | os.PathLike, model, *, threads: int, depth: int, max_positions: int,
                  gen_tokens: int, repetitions: int, repack: bool = True) -> list[str]:
    """llama-bench: prompt processing of m = 1..max_positions positions and gen_tokens one-token steps, each after a
    prefill of `depth` positions, `repetitions` times, JSON lines out."""
    return [str(Path(bin_dir) / "llama-bench"), "-m", str(model), "-p",
            ",".join(str(m) for m in range(1, max_positions + 1)), "-n", str(gen_tokens), "-d", str(depth),
            "-t", str(threads), "-r", str(repetitions), "-o", "jsonl", *([] if repack else ["--repack", "0"])]


# --------------------------------------------------------------------------------------------------- parsing
@dataclass
class JsonlLog:
    """A tool's --log-jsonl output: the emitted-text entries (level none) and the message lines (info and up)."""

    outputs: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)  # lines that are not JSON (printed around the logger)

    @property
    def text(self) -> str:
        return "".join(self.messages)


def read_jsonl_log(stdout: str) -> JsonlLog:
    out = JsonlLog()
    for line in stdout.splitlines():
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            out.other.append(line)
            continue
        if not isinstance(entry, dict) or entry.get("type") != "log":
            out.other.append(line)
            continue
        (out.outputs if entry.get("level") == "none" else out.messages).append(entry.get("msg", ""))
    return out


def _search(pattern: str, text: str, what: str, cast=float):
    m = re.search(pattern, text, re.MULTILINE)
    if not m:
        raise LlamaCppParseError(f"no {what} in the tool's output (pattern {pattern!r})")
    return tuple(cast(g) for g in m.groups()) if len(m.groups()) > 1 else cast(m.group(1))


def _perf(text: str, key: str) -> tuple[float, int]:
    """(ms, count) of common_perf_print's 'prompt eval time = X ms / N tokens' or 'eval time = X ms / N runs'."""
    pattern = {"prompt_eval": r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens",
               "eval": r"(?<!prompt )\beval time =\s*([\d.]+) ms /\s*(\d+) runs"}[key]
    ms, n = _search(pattern, text, f"'{key.replace('_', ' ')} time' line")
    return float(ms), int(n)


def _sampling_ms(text: str) -> float:
    return float(_search(r"sampling time =\s*([\d.]+) ms", text, "'sampling time' line"))


def _prompt_ids(messages: Sequence[str]) -> list[int]:
    """The prompt's token ids --verbose-prompt logs ('%6d -> '<piece>'' after 'number of tokens in prompt')."""
    ids, inside = [], False
    for msg in messages:
        if "number of tokens in prompt" in msg:
            inside = True
            continue
        if inside:
            m = re.match(r"^\s*(-?\d+) -> '", msg)
            if not m:
                if ids:
                    break
                continue
            ids.append(int(m.group(1)))
    return ids


CLOSING = "\n\n"  # both tools LOG("\n\n") after the generated text


def parse_plain(stdout: str) -> dict:
    """llama-completion's --log-jsonl output: the emitted pieces (one log entry per generated token, then the closing
    "\n\n"; a final EOS shows as an empty piece followed by ' [end of text]'), the prompt's token ids
    (--verbose-prompt) and the per-token times.

    seconds_per_token = eval ms / eval runs (one-token target steps) + sampling ms / sampled tokens (the greedy pick):
    what a plain decoding loop pays per token after the prompt.
    """
    log = read_jsonl_log(stdout)
    pieces = list(log.outputs)
    if not pieces or pieces[-1] != CLOSING:
        raise LlamaCppParseError("plain output does not end with the closing line (the run was cut short?)")
    pieces.pop()
    eos = bool(pieces) and pieces[-1] == " [end of text]\n"
    if eos:
        pieces.pop()
        if pieces and pieces[-1] == "":  # the EOS token itself, printed as an empty piece
            pieces.pop()
    text = log.text
    eval_ms, n_eval = _perf(text, "eval")
    p_ms, n_p = _perf(text, "prompt_eval")
    sample_ms = _sampling_ms(text)
    n_sampled = len(pieces) + int(eos)
    seconds = eval_ms / max(n_eval, 1) / 1e3 + sample_ms / max(n_sampled, 1) / 1e3
    prompt_ids = _prompt_ids(log.messages)
    return {"pieces": pieces, "n_emitted": len(pieces), "eos": eos, "prompt_ids": prompt_ids,
            "n_prompt_llama": len(prompt_ids) or n_p, "eval_ms": eval_ms, "n_eval": n_eval,
            "sampling_ms": sample_ms, "prompt_eval_ms": p_ms, "n_prompt_eval": n_p, "seconds_per_token": seconds,
            "tokens_per_second": 1.0 / seconds if seconds > 0 else float("nan")}


_STATS = (r"statistics\s+(\S+): #calls\(b,g,a\) =\s*(\d+)\s+(\d+)\s+(\d+), #gen drafts =\s*(\d+), "
          r"#acc drafts =\s*(\d+), #gen tokens =\s*(\d+), #acc tokens =\s*(\d+)"
          r"(?:, #mean acc len =\s*([\d.]+), #acc rate/pos = \(([^)]*)\))?(?:, dur\(b,g,a\) = ([\d.]+), ([\d.]+), "
          r"([\d.]+) ms)?")


def parse_speculative(stdout: str) -> dict:
    """llama-speculative-simple's --log-jsonl -lv 4 output: the emitted pieces (the output entries are "\n\n", one
    per prompt token, one per emitted token (EOS is not printed), "\n\n" after the loop and "\n\n" at exit), its
    counters and the decode loop's time."""
    log = read_jsonl_log(stdout)
    text = log.text
    n_input, enc_s = _search(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds", text, "'encoded' line")
    n_predict, dec_s = _search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", text, "'decoded' line")
    n_input, n_predict = int(n_input), int(n_predict)
    outputs = list(log.outputs)
    if len(outputs) < 3 + n_input or outputs[0] != CLOSING or outputs[-2:] != [CLOSING, CLOSING]:
        raise LlamaCppParseError("speculative output is not '\\n\\n', prompt, tokens, '\\n\\n', '\\n\\n' (cut short?)")
    pieces = outputs[1 + n_input:-2]
    counters = {name: int(_search(rf"^{name}\s*=\s*(\d+)", text, f"'{name}' line", int))
                for name in ("n_draft", "n_predict", "n_drafted", "n_accept")}
    m = re.search(_STATS, text)
    if not m:
        raise LlamaCppParseError("no speculative statistics line (it is printed at -lv 4)")
    g = m.groups()
    nan = float("nan")
    stats = {"spec_type": g[0], "n_call_begin": int(g[1]), "n_call_draft": int(g[2]), "n_call_accept": int(g[3]),
             "n_gen_drafts": int(g[4]), "n_acc_drafts": int(g[5]), "n_gen_tokens": int(g[6]),
             "n_acc_tokens": int(g[7]), "mean_acc_len": float(g[8]) if g[8] else nan,
             "acc_rate_per_pos": [float(x) for x in g[9].split(",")] if g[9] else [],
             "draft_begin_ms": float(g[10]) if g[10] else nan, "draft_gen_ms": float(g[11]) if g[11] else nan,
             "draft_accept_ms": float(g[12]) if g[12] else nan}
    target_p_ms, target_p_n = _perf(text, "prompt_eval")
    target_ms, target_n = _perf(text, "eval")
    if len(pieces) not in (n_predict, n_predict - 1):  # an EOS is counted in n_predict but not printed
        raise LlamaCppParseError(f"{len(pieces)} emitted pieces but n_predict = {n_predict}")
    return {"pieces": pieces, "n_emitted": len(pieces), "eos": len(pieces) == n_predict - 1, "prompt_ids": [],
            "n_prompt_llama": n_input, "encode_seconds": float(enc_s), "decode_seconds": float(dec_s),
            "tokens_per_second": n_predict / float(dec_s) if float(dec_s) > 0 else nan, **counters, **stats,
            "target_multi_ms": target_p_ms, "target_multi_tokens": target_p_n,
            "target_single_ms": target_ms, "target_single_runs": target_n, "sampling_ms": _sampling_ms(text)}


def parse_bench(stdout: str) -> pd.DataFrame:
    """llama-bench -o jsonl: one row per test with its per-repetition samples (seconds)."""
    rows = []
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        t = json.loads(line)
        rows.append({"model_filename": Path(t["model_filename"]).name, "model_type": t.get("model_type"),
                     "model_size": t.get("model_size"), "n_params": t.get("model_n_params"),
                     "n_threads": t.get("n_threads"), "n_prompt": int(t["n_prompt"]), "n_gen": int(t["n_gen"]),
                     "n_depth": int(t.get("n_depth", 0)), "samples_s": [ns / 1e9 for ns in t["samples_ns"]],
                     "avg_s": t["avg_ns"] / 1e9, "build_commit": t.get("build_commit"),
                     "build_number": t.get("build_number"), "cpu_info": t.get("cpu_info"),
                     "flash_attn": t.get("flash_attn"), "n_batch": t.get("n_batch"), "n_ubatch": t.get("n_ubatch")})
    if not rows:
        raise LlamaCppParseError("llama-bench printed no JSON line")
    return pd.DataFrame(rows)


def first_difference(a: Sequence, b: Sequence, n: int | None = None) -> int | None:
    """The first position where two token sequences differ within their first n (a shorter one differs where it
    ends), or None when they agree."""
    a, b = list(a)[:n], list(b)[:n]
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# --------------------------------------------------------------------------------------------------- GGUF facts
def gguf_facts(path: str | os.PathLike) -> dict:
    """Layers and the bytes one decoding step reads from a GGUF's tensor table.

    step_bytes: every tensor, except that the token embedding is only looked up (one row per token) when the model has
    a separate output matrix; with a tied head the embedding is the LM head and is read whole.
    """
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    layers = int(reader.fields[f"{arch}.block_count"].contents())
    tensors = {t.name: t for t in reader.tensors}
    total = sum(int(t.n_bytes) for t in tensors.values())
    embd = tensors.get("token_embd.weight")
    tied = "output.weight" not in tensors
    step = total if tied or embd is None else total - int(embd.n_bytes) + int(embd.n_bytes) // int(embd.shape[-1])
    types = {}
    for t in tensors.values():
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + int(t.n_bytes)
    name = reader.fields["general.name"].contents() if "general.name" in reader.fields else Path(path).stem
    return {"file": Path(path).name, "general_name": name, "architecture": arch, "n_layers": layers,
            "tensor_bytes": total, "step_bytes": step, "tied_head": tied, "bytes_by_type": types}


# --------------------------------------------------------------------------------------------------- GGUF export
def _field_value(f):
    from gguf import GGUFValueType

    value = f.contents()
    main = f.types[0]
    sub = f.types[-1] if main == GGUFValueType.ARRAY else None
    return value, main, sub


def export_gguf(model_dir: str | os.PathLike, base_gguf: str | os.PathLike, out: str | os.PathLike,
                log: Log = print) -> dict:
    """A prepared safetensors model (a truncated or distilled draft: the first layers of `base_gguf`'s model, maybe
    retrained) written as a GGUF with the base file's metadata, tokenizer and chat template.

    Each tensor equal to the dequantised base tensor of the same name is copied in its original quantised form (a
    truncated draft is then an exact cut of the base file); a changed tensor is quantised by the `gguf` package in the
    base tensor's type where that package can quantise it (Q8_0, Q5_0, Q4_0, BF16, F16/F32), else in Q8_0 (it cannot
    make K-quants: Q4_K, Q6_K tensors that training changed become Q8_0, so such a draft reads more bytes than a
    K-quantised one would). Returns {tensor name: how it was written}.
    """
    import gguf
    from safetensors.torch import load_file

    model_dir, out = Path(model_dir), Path(out)
    cfg = json.loads((model_dir / "config.json").read_text())
    n_layers = int(cfg["num_hidden_layers"])
    reader = gguf.GGUFReader(str(base_gguf))
    arch = reader.fields["general.architecture"].contents()
    base_layers = int(reader.fields[f"{arch}.block_count"].contents())
    if not 1 <= n_layers <= base_layers:
        raise LlamaCppError(f"{model_dir} has {n_layers} layers; its base GGUF {base_gguf} has {base_layers}")
    base = {t.name: t for t in reader.tensors}
    state = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(str(f)))
    name_map = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), n_layers)
    partial = Path(str(out) + ".partial")
    try:
        how = _write_export(gguf, reader, state, name_map, base, partial, arch, n_layers, model_dir.name)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    log(f"exported {out}: {n_layers} layers; " + ", ".join(f"{v}: {list(how.values()).count(v)}"
                                                           for v in sorted(set(how.values()))))
    return how


def _write_export(gguf, reader, state: dict, name_map, base: dict, path: Path, arch: str, n_layers: int,
                  name: str) -> dict:
    import torch
    from gguf import GGMLQuantizationType as Q

    quantisable = {Q.Q8_0, Q.Q5_0, Q.Q5_1, Q.Q4_0, Q.Q4_1, Q.BF16}
    writer = gguf.GGUFWriter(str(path), arch)
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        value, main, sub = _field_value(f)
        if f.name == f"{arch}.block_count":
            value = n_layers
        elif f.name == "general.name":
            value = f"{value} (first {n_layers} layers, {name})"
        writer.add_key_value(f.name, value, main, sub_type=sub)
    how = {}
    for hf_name, tensor in state.items():
        gg = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gg is None:
            raise LlamaCppError(f"{name}: no GGUF name for tensor {hf_name}")
        ref = base.get(gg)
        data = tensor.to(torch.float32).numpy()
        if ref is not None:
            ref_values = gguf.quants.dequantize(ref.data, ref.tensor_type).reshape(data.shape)
            if np.array_equal(ref_values, data):
                writer.add_tensor(gg, np.asarray(ref.data), raw_shape=list(ref.data.shape), raw_dtype=ref.tensor_type)
                how[gg] = f"copied {ref.tensor_type.name}"
                continue
        qtype = ref.tensor_type if ref is not None else Q.Q8_0
        if data.ndim == 1 or qtype in (Q.F32, Q.F16):
            qtype = Q.F32 if data.ndim == 1 else qtype
            arr = data.astype(np.float32 if qtype == Q.F32 else np.float16)
            writer.add_tensor(gg, arr, raw_dtype=qtype)
        else:
            if qtype not in quantisable:
                qtype = Q.Q8_0
            q = gguf.quants.quantize(data, qtype)
            writer.add_tensor(gg, q, raw_shape=list(q.shape), raw_dtype=qtype)
        how[gg] = f"quantised {qtype.name}"
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return how


# --------------------------------------------------------------------------------------------------- running
def run_tool(cmd: Sequence[str], timeout: float | None = None) -> subprocess.CompletedProcess:
    res = subprocess.run(list(cmd), capture_output=True, text=True, errors="replace", timeout=timeout, check=False)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-5:]
        hint = ""
        if res.returncode == -signal.SIGSEGV and "--no-repack" not in cmd and "--repack" not in cmd:
            # Seen on an Intel Xeon with AMX: llama.cpp 0.3.36's AMX-repacked weights crash on any pass over two or
            # more positions (prompt passes, verify passes); one-token steps run.
            hint = (" (a segmentation fault; on a CPU with AMX, llama.cpp's repacked weights crash on passes over"
                    " several positions: set llamacpp.repack: false)")
        raise LlamaCppRunError(f"{Path(cmd[0]).name} exited {res.returncode}{hint}: {' | '.join(tail)}")
    return res


PLAIN = "plain"


def _decode_run(method, *, bin_dir, target, draft, prompt_file: Path, settings: RunSettings,
                raw: Callable[[str, str], None] | None, label: str) -> dict:
    """One llama.cpp process: the plain run (method PLAIN) or the speculative run at k = method, parsed."""
    if method == PLAIN:
        cmd = plain_command(bin_dir, target, prompt_file, settings)
    else:
        cmd = speculative_command(bin_dir, target, draft, prompt_file, int(method), settings)
    t0 = time.perf_counter()
    res = run_tool(cmd)
    wall = time.perf_counter() - t0
    if raw is not None:
        raw(f"{label} {method}: {shlex.join(cmd)}", res.stdout)
    parsed = parse_plain(res.stdout) if method == PLAIN else parse_speculative(res.stdout)
    return {**parsed, "process_seconds": wall}


def decode_job(prompts: pd.DataFrame, *, bin_dir, target, draft, ks: Sequence[int], settings: RunSettings,
               repeats: int = 1, workdir: str | os.PathLike | None = None, log: Log = print,
               raw: Callable[[str, str], None] | None = None) -> pd.DataFrame:
    """Per prompt and repeat, llama.cpp's plain run and one speculative run per k, back to back in rotating order
    (`interleave.run_in_rotation`), each a fresh process. One row per run; each row carries the first position where
    its tokens differ from the plain run of the same prompt and repeat within max_new_tokens (None: identical).

    `raw(name, stdout)` receives every tool's output (for the job's log)."""
    from functools import partial

    from .interleave import run_in_rotation

    methods = [PLAIN, *ks]
    n = settings.max_new_tokens
    rows = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for index, prompt in enumerate(prompts.itertuples(index=False)):
            prompt_file = write_prompt(prompt.chat_text, Path(tmp) / f"prompt{index}.txt")  # ids may hold '/'
            for repeat in range(repeats):
                run = partial(_decode_run, bin_dir=bin_dir, target=target, draft=draft, prompt_file=prompt_file,
                              settings=settings, raw=raw, label=f"{prompt.prompt_id} r{repeat}")
                results = run_in_rotation(methods, index + repeat, run)  # dict in the order they ran
                plain = results[PLAIN]
                notes = []
                for order, (method, r) in enumerate(results.items()):
                    first = first_difference(r["pieces"], plain["pieces"], n)
                    rows.append({"prompt_id": prompt.prompt_id, "repeat": repeat,
                                 "method": "plain" if method == PLAIN else "speculative",
                                 "k": 0 if method == PLAIN else int(method), "order": order,
                                 "n_prompt_tokens": len(prompt.input_ids), **r,
                                 "first_diff": first, "identical": first is None})
                    if method != PLAIN:
                        notes.append(f"k{method} {r['tokens_per_second']:.2f} tok/s, {r['mean_acc_len']:.2f} "
                                     f"tok/pass, {'same' if first is None else f'DIFFERS at {first}'}")
                log(f"[{index + 1}/{len(prompts)} r{repeat}] {prompt.prompt_id}: plain "
                    f"{plain['tokens_per_second']:.2f} tok/s; " + "; ".join(notes))
    frame = pd.DataFrame(rows)
    frame["pieces"] = frame["pieces"].map(list)
    frame["prompt_ids"] = frame["prompt_ids"].map(list)
    if "acc_rate_per_pos" in frame:
        frame["acc_rate_per_pos"] = frame["acc_rate_per_pos"].map(lambda v: list(v) if isinstance(v, list) else [])
    return frame


def _bench_run(name, *, models, bin_dir, rnd: int, raw, **bench) -> pd.DataFrame:
    cmd = bench_command(bin_dir, models[name], **bench)
    res = run_tool(cmd)
    if raw is not None:
        raw(f"round {rnd} {name}: {shlex.join(cmd)}", res.stdout)
    return parse_bench(res.stdout).assign(model=name, round=rnd)


def bench_job(models: dict[str, str | os.PathLike], *, bin_dir, threads: int, depth: int, max_positions: int,
              gen_tokens: int, repetitions: int, rounds: int, repack: bool = True, log: Log = print,
              raw: Callable[[str, str], None] | None = None) -> pd.DataFrame:
    """llama-bench of every model, `rounds` times in rotating model order (one process each): one row per test and
    round, with the samples of its repetitions."""
    from functools import partial

    from .interleave import run_in_rotation

    frames = []
    for rnd in range(rounds):
        run = partial(_bench_run, models=models, bin_dir=bin_dir, rnd=rnd, raw=raw, threads=threads, depth=depth,
                      max_positions=max_positions, gen_tokens=gen_tokens, repetitions=repetitions, repack=repack)
        for name, frame in run_in_rotation(list(models), rnd, run).items():
            tg = frame[frame["n_gen"] > 0]["avg_s"]
            step = f": step {1e3 * tg.iloc[0] / gen_tokens:.1f} ms" if len(tg) else ""
            log(f"round {rnd} {name}{step}")
            frames.append(frame)
    return pd.concat(frames, ignore_index=True)


# --------------------------------------------------------------------------------------------------- tables
def step_costs(bench: pd.DataFrame) -> pd.DataFrame:
    """Per model: the one-token step (tg: seconds per generated token, every repetition of every round) and the
    pass over m positions (pp m), medians with bootstrap intervals; ratio_to_step = pass(m) / step."""
    from .stats import bootstrap_median_interval

    rows = []
    for model, frame in bench.groupby("model", sort=False):
        tg = frame[frame["n_gen"] > 0]
        step = np.concatenate([np.asarray(s) / n for s, n in zip(tg["samples_s"], tg["n_gen"])]) if len(tg) else []
        med, lo, hi = bootstrap_median_interval(np.asarray(step))
        rows.append({"model": model, "m": 0, "what": "step (tg)", "seconds": med, "seconds_lo": lo, "seconds_hi": hi,
                     "n_depth": int(frame["n_depth"].iloc[0]), "n_threads": int(frame["n_threads"].iloc[0])})
        pp = frame[(frame["n_prompt"] > 0) & (frame["n_gen"] == 0)]
        for m, sub in pp.groupby("n_prompt"):
            med, lo, hi = bootstrap_median_interval(np.concatenate([np.asarray(s) for s in sub["samples_s"]]))
            rows.append({"model": model, "m": int(m), "what": f"pass of {m} positions (pp)", "seconds": med,
                         "seconds_lo": lo, "seconds_hi": hi, "n_depth": int(sub["n_depth"].iloc[0]),
                         "n_threads": int(sub["n_threads"].iloc[0])})
    out = pd.DataFrame(rows)
    # relative to the steady one-token step (tg, many tokens per sample), not to pp 1 (one decode per sample, noisy)
    step = out[out["m"] == 0].set_index("model")["seconds"]
    out["ratio_to_step"] = out.apply(lambda r: r["seconds"] / step.get(r["model"], np.nan), axis=1)
    return out


def _cost(costs: pd.DataFrame, model: str, m: int) -> float:
    sel = costs[(costs["model"] == model) & (costs["m"] == m)]["seconds"]
    return float(sel.iloc[0]) if len(sel) else float("nan")


def predicted_llamacpp_speedup(tokens_per_pass: float, costs: pd.DataFrame, target: str, draft: str, k: int) -> float:
    """costmodel.predicted_speedup with llama.cpp's measured costs and draft-simple's work per pass: k one-token draft
    calls (the first on the previous pass's last token) plus one draft pass over the k + 1 verified positions
    (common_speculative_process feeds the target's batch to the draft), i.e. the catch-up call every pass."""
    from .costmodel import predicted_speedup

    t1 = _cost(costs, target, 0)
    td = _cost(costs, draft, 0)
    verify = _cost(costs, target, k + 1)
    catchup = td + _cost(costs, draft, k + 1)
    return predicted_speedup(tokens_per_pass, t1, td, verify, catchup, 1.0, k=k)


TABLE_COLUMNS = ["draft", "domain", "k", "n_prompts", "n_repeats", "plain_tokens_per_s", "plain_tokens_per_s_lo",
                 "plain_tokens_per_s_hi", "spec_tokens_per_s", "spec_tokens_per_s_lo", "spec_tokens_per_s_hi",
                 "speedup", "speedup_lo", "speedup_hi", "acceptance", "tokens_per_pass", "n_identical", "n_compared",
                 "first_diffs", "c", "depth_ratio", "bytes_ratio", "verify_ratio_k1", "predicted_speedup",
                 "engine_baseline_tokens_per_s", "engine_spec_tokens_per_s", "engine_draft", "threads"]


def summarize(runs: pd.DataFrame, costs: pd.DataFrame, facts: dict[str, dict], target: str,
              engine: pd.DataFrame | None = None, threads: int | None = None,
              engine_fallback: Sequence[str] = ()) -> pd.DataFrame:
    """One row per (draft, domain, k) of the llama.cpp runs.

    speedup: per prompt and repeat, speculative tokens/s over plain tokens/s of the same turn; median over turns with
    a 95% bootstrap interval (as are the tokens/s). acceptance = n_accept / n_drafted and tokens_per_pass = 1 +
    accepted / verify passes (llama.cpp's '#mean acc len'), pooled over the cell's runs. n_identical of n_compared:
    speculative runs whose emitted tokens equal the plain run's (first max_new_tokens); first_diffs lists
    'prompt_id@position' of the others. c, depth and bytes ratios: draft / target; verify_ratio_k1: the target's
    pass over k + 1 positions / its one-token step (llama-bench tg, same depth and threads).
    """
    from .stats import bootstrap_median_interval

    rows = []
    keys = ["prompt_id", "repeat"]
    for (draft, domain), cell in runs.groupby(["draft", "domain"], sort=False):
        plain = cell[cell["method"] == "plain"].set_index(keys)["tokens_per_second"]
        for k, spec in cell[cell["method"] == "speculative"].groupby("k"):
            s = spec.set_index(keys)
            ratio = (s["tokens_per_second"] / plain.reindex(s.index)).to_numpy()
            sp, sp_lo, sp_hi = bootstrap_median_interval(ratio)
            pt, pt_lo, pt_hi = bootstrap_median_interval(plain.reindex(s.index).to_numpy())
            st, st_lo, st_hi = bootstrap_median_interval(s["tokens_per_second"].to_numpy())
            tpp = 1.0 + spec["n_acc_tokens"].sum() / max(spec["n_call_accept"].sum(), 1)
            diffs = spec[~spec["identical"]]
            fd, fdepth, fbytes = facts.get(draft, {}), facts.get(target, {}), None
            if fd and fdepth:
                fbytes = fd["step_bytes"] / fdepth["step_bytes"]
            c = _cost(costs, draft, 0) / _cost(costs, target, 0)
            row = {"draft": draft, "domain": domain, "k": int(k), "n_prompts": spec["prompt_id"].nunique(),
                   "n_repeats": spec["repeat"].nunique(),
                   "plain_tokens_per_s": pt, "plain_tokens_per_s_lo": pt_lo, "plain_tokens_per_s_hi": pt_hi,
                   "spec_tokens_per_s": st, "spec_tokens_per_s_lo": st_lo, "spec_tokens_per_s_hi": st_hi,
                   "speedup": sp, "speedup_lo": sp_lo, "speedup_hi": sp_hi,
                   "acceptance": spec["n_accept"].sum() / max(spec["n_drafted"].sum(), 1),
                   "tokens_per_pass": tpp, "n_identical": int(spec["identical"].sum()), "n_compared": len(spec),
                   "first_diffs": ";".join(f"{r.prompt_id}@{int(r.first_diff)}" for r in diffs.itertuples()),
                   "c": c, "depth_ratio": fd["n_layers"] / fdepth["n_layers"] if fd and fdepth else float("nan"),
                   "bytes_ratio": fbytes if fbytes is not None else float("nan"),
                   "verify_ratio_k1": _cost(costs, target, int(k) + 1) / _cost(costs, target, 0),
                   "predicted_speedup": predicted_llamacpp_speedup(tpp, costs, target, draft, int(k)),
                   "threads": threads}
            row.update(engine_scale(engine, draft, domain, int(k), engine_fallback))
            rows.append(row)
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def engine_speeds(sequence_files: Iterable[str | os.PathLike], prompt_ids: dict[str, set] | None = None) -> pd.DataFrame:
    """Our engine's tokens/s, per sequence, from greedy decode runs of the study or the draft sweep
    (sequences.parquet under [sweep/]runs/greedy/<draft>/<domain>/k<k>/seed0/): n_tokens / total_seconds, keeping only
    the prompts llama.cpp ran (`prompt_ids` per domain). Empty when there are no such files."""
    frames = []
    for path in sequence_files:
        path = Path(path)
        try:
            draft, domain, kdir = path.parts[-5], path.parts[-4], path.parts[-3]
            seq = pd.read_parquet(path, columns=["prompt_id", "method", "n_tokens", "total_seconds"])
        except (IndexError, OSError, ValueError, KeyError):
            continue
        if prompt_ids is not None:
            seq = seq[seq["prompt_id"].isin(prompt_ids.get(domain, set()))]
        if len(seq):
            frames.append(pd.DataFrame({"draft": draft, "domain": domain, "k": int(kdir.lstrip("k")),
                                        "prompt_id": seq["prompt_id"].to_numpy(), "method": seq["method"].to_numpy(),
                                        "tokens_per_s": (seq["n_tokens"] / seq["total_seconds"]).to_numpy()}))
    columns = ["draft", "domain", "k", "prompt_id", "method", "tokens_per_s"]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def engine_scale(engine: pd.DataFrame, draft: str, domain: str, k: int, fallback: Sequence[str] = ()) -> dict:
    """Our engine next to a llama.cpp cell: its plain (baseline) tokens/s on the domain's prompts, pooled over every
    run found (the baseline does not depend on the draft or k), and its speculative tokens/s at k with the same draft,
    else with the first of `fallback` (the study's drafts) that has runs; engine_draft names which. NaN without runs."""
    nan = float("nan")
    out = {"engine_baseline_tokens_per_s": nan, "engine_spec_tokens_per_s": nan, "engine_draft": None}
    if engine is None or not len(engine):
        return out
    dom = engine[engine["domain"] == domain]
    base = dom[dom["method"] == "baseline"]["tokens_per_s"]
    if len(base):
        out["engine_baseline_tokens_per_s"] = float(base.median())
    spec = dom[(dom["method"] == "speculative") & (dom["k"] == int(k))]
    for name in (draft, *fallback):
        chosen = spec[spec["draft"] == name]["tokens_per_s"]
        if len(chosen):
            out["engine_spec_tokens_per_s"], out["engine_draft"] = float(chosen.median()), name
            break
    return out
