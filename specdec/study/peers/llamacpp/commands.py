"""The command lines of the three llama.cpp tools the stage runs (plain, speculative, bench), and the prompt
file they read."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


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
