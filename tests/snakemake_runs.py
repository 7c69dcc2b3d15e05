"""Snakemake invocations for the tests, dry runs without paying Snakemake's start-up each time.

A dry run of the study spends ~2.6 of its ~4 s importing Snakemake and the study's planning modules (scipy.stats
among them), and the suite makes dozens. `run` sends a dry run to a server process of this pytest worker that has
imported them once and forks for every run: the child parses the command line, changes to the run's directory,
takes its environment and calls Snakemake's own entry point, with its output going to files as a subprocess's
would. Each run still starts from a clean state (the fork of a process that never ran a workflow), and gives what
`subprocess.run` gives (tests/test_workflow_plan.py checks it). Anything but a dry run (real jobs, locks, their own
subprocesses) runs as a subprocess, and so does every run where the OS has no fork."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback

_server: subprocess.Popen | None = None


def is_dry_run(args) -> bool:
    return "--dry-run" in args or "-n" in args


def run(args: list[str], cwd=None, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m snakemake *args` in cwd with env (default: this process's), as subprocess.run(capture_output=True,
    text=True) gives it; subprocess.TimeoutExpired past timeout."""
    args, env, cwd = [str(a) for a in args], dict(os.environ if env is None else env), str(cwd or os.getcwd())
    if not is_dry_run(args) or not hasattr(os, "fork"):  # (no fork: every run a subprocess)
        return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)
    server = _started()
    server.stdin.write(json.dumps({"args": args, "cwd": cwd, "env": env, "timeout": timeout}) + "\n")
    server.stdin.flush()
    line = server.stdout.readline()
    if not line:
        raise RuntimeError(f"the dry-run server stopped (exit status {server.poll()})")
    reply = json.loads(line)
    if reply.get("timed_out"):
        raise subprocess.TimeoutExpired(["snakemake", *args], timeout, reply["stdout"], reply["stderr"])
    return subprocess.CompletedProcess(["snakemake", *args], reply["returncode"], reply["stdout"], reply["stderr"])


def _started() -> subprocess.Popen:
    global _server
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True)
    return _server


def _child(request: dict, out, err) -> int:
    """In the forked child: Snakemake's entry point on the request, its output in out and err. The exit status."""
    import snakemake.cli

    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # the path of `python -m snakemake` started there: its directory first, then PYTHONPATH's (the tests' plugins)
    sys.path[0] = request["cwd"]
    sys.path[1:1] = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    try:
        snakemake.cli.main(request["args"])
        return 0
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _wait(pid: int, timeout: float) -> int | None:
    """The child's exit status, or None after killing it past timeout."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.01)


def _serve() -> None:
    import snakemake.cli  # noqa: F401  the start-up every dry run shares
    import specdec.study.plan  # noqa: F401  what the Snakefile imports

    replies = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            replies.flush()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = _child(request, out, err)
                finally:
                    os._exit(code)
            code = _wait(pid, request["timeout"])
            texts = []
            for stream in (out, err):
                stream.seek(0)
                texts.append(stream.read().decode(errors="replace"))
        reply = {"returncode": code, "timed_out": code is None, "stdout": texts[0], "stderr": texts[1]}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    _serve()
