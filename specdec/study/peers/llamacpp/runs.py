"""Running the tools: one process per run (a crash named), the decode job (plain and speculative runs per
prompt, in rotating order, compared token by token) and the bench job (llama-bench per model, in rounds)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import pandas as pd

from specdec.study.verify.divergence import first_difference
from specdec.study.prepare.wheels import Log
from .commands import RunSettings, bench_command, plain_command, speculative_command, write_prompt
from .errors import LlamaCppRunError
from .parse import parse_bench, parse_plain, parse_speculative


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


def decode_run(method, *, bin_dir, target, draft, prompt_file: Path, settings: RunSettings,
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
    # imports torch: not at the Snakefile's import of this package
    from specdec.study.decoding.interleave import run_in_rotation

    methods = [PLAIN, *ks]
    n = settings.max_new_tokens
    rows = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for index, prompt in enumerate(prompts.itertuples(index=False)):
            prompt_file = write_prompt(prompt.chat_text, Path(tmp) / f"prompt{index}.txt")  # ids may hold '/'
            for repeat in range(repeats):
                run = partial(decode_run, bin_dir=bin_dir, target=target, draft=draft, prompt_file=prompt_file,
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
    from specdec.study.decoding.interleave import run_in_rotation

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
