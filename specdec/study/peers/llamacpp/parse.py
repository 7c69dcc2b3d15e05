"""Parsing the tools' output: the --log-jsonl lines of llama-completion and llama-speculative-simple (the emitted
pieces, token by token, and their counters) and llama-bench's JSON lines.

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

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .errors import LlamaCppParseError


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
    # An EOS is counted in n_predict but not printed; where it came inside an accepted block, the block's tokens
    # after it are counted too (seen: 53 pieces, n_predict 55). So the run emitted its pieces and, if fewer than
    # n_predict, an EOS: the rate counts those (the same as n_predict / seconds in the usual cases).
    if len(pieces) > n_predict:
        raise LlamaCppParseError(f"{len(pieces)} emitted pieces but n_predict = {n_predict}")
    eos = len(pieces) < n_predict
    emitted = len(pieces) + int(eos)
    return {"pieces": pieces, "n_emitted": len(pieces), "eos": eos, "prompt_ids": [],
            "n_prompt_llama": n_input, "encode_seconds": float(enc_s), "decode_seconds": float(dec_s),
            "tokens_per_second": emitted / float(dec_s) if float(dec_s) > 0 else nan, **counters, **stats,
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
