"""Plain greedy decoding with and without the exact argmax head (specdec/gguf/argmax_head.py), in one process.

    python bench/argmax_head.py --prompts-dir results/experiments/cpu-lead/<machine>/prompts \\
        [--mode runs|steps] [--target resources/gguf/qwen2.5-coder-1.5b-instruct.gguf]
        [--domains code factual dialogue prose] [--prompts 5] [--max-new-tokens 128] [--repeats 2] [--out F.csv]

Two sessions over the same weights: one with the full Q6_K head, one with the argmax head (runtime argmax_head).
`--mode runs`: each prompt and repeat decodes on both in alternating order; the rate is the side by side's (the
tokens after the first over the time after the prompt pass). `--mode steps` (the finer measure: the host's
bandwidth drifts within a run): the full head's greedy tokens are fed to both sessions one step at a time, the two
steps of each token timed back to back in alternating order, with `timed_extend`'s head seconds; the argmax of both
is checked equal at every step. Prints per domain the median ratio (argmax head / full head) with its 95% bootstrap
interval (runs: whether every run's tokens are the same; steps: the head's milliseconds), and the candidate rows per
step (median, 90th percentile, largest, and the steps that ran the whole head). Run it alone on the machine."""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
import torch

from specdec.decode import generate_baseline
from specdec.gguf.lean import LeanLM
from specdec.gguf.model import read_gguf
from specdec.study.io import write_csv
from specdec.study.peers.vs_llamacpp import generation_rate
from specdec.study.stats import bootstrap_median_interval


def run_pairs(args, sessions) -> pd.DataFrame:
    rows = []
    for domain in args.domains:
        prompts = pd.read_parquet(f"{args.prompts_dir}/{domain}.parquet").head(args.prompts)
        for index, prompt in enumerate(prompts.itertuples()):
            input_ids = torch.tensor([list(prompt.input_ids)])
            for repeat in range(args.repeats):
                order = ["full", "argmax"] if (index + repeat) % 2 == 0 else ["argmax", "full"]
                out = {}
                for name in order:
                    result = generate_baseline(sessions[name], input_ids, args.max_new_tokens)
                    rate, _ = generation_rate(result)
                    out[name] = (rate, list(result.tokens))
                rows.append({"domain": domain, "prompt_id": prompt.prompt_id, "repeat": repeat,
                             "full_tokens_per_s": out["full"][0], "argmax_tokens_per_s": out["argmax"][0],
                             "ratio": out["argmax"][0] / out["full"][0],
                             "identical": out["argmax"][1] == out["full"][1]})
                print(f"{prompt.prompt_id} r{repeat}: full {out['full'][0]:.2f}, argmax {out['argmax'][0]:.2f} "
                      f"tok/s, identical {rows[-1]['identical']}", flush=True)
    return pd.DataFrame(rows)


def step_pairs(args, sessions) -> pd.DataFrame:
    rows = []
    sessions["argmax"].set_argmax_only(True)  # as the greedy loops do
    for domain in args.domains:
        prompts = pd.read_parquet(f"{args.prompts_dir}/{domain}.parquet").head(args.prompts)
        for prompt in prompts.itertuples():
            ids = [int(t) for t in prompt.input_ids]
            tokens = generate_baseline(sessions["full"], torch.tensor([ids]), args.max_new_tokens).tokens
            for session in sessions.values():
                session.reset()
                session.extend(ids, 1)
            for j, token in enumerate(tokens[:-1]):
                out = {}
                for name in (["full", "argmax"] if j % 2 == 0 else ["argmax", "full"]):
                    start = time.perf_counter()
                    logits, parts = sessions[name].timed_extend([token], 1)
                    out[name] = (time.perf_counter() - start, parts["lm_head"], int(logits[0].argmax()))
                if out["full"][2] != out["argmax"][2]:
                    raise AssertionError(f"{prompt.prompt_id} step {j}: argmax {out['argmax'][2]} against the full "
                                         f"head's {out['full'][2]}")
                rows.append({"domain": domain, "prompt_id": prompt.prompt_id, "step": j,
                             "full_seconds": out["full"][0], "argmax_seconds": out["argmax"][0],
                             "full_head": out["full"][1], "argmax_head": out["argmax"][1],
                             "ratio": out["argmax"][0] / out["full"][0]})
            print(f"{prompt.prompt_id}: {len(tokens) - 1} steps, median ratio "
                  f"{np.median([r['ratio'] for r in rows if r['prompt_id'] == prompt.prompt_id]):.3f}", flush=True)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts-dir", required=True, help="a study's prompts/ directory ({domain}.parquet)")
    parser.add_argument("--mode", choices=("runs", "steps"), default="runs")
    parser.add_argument("--target", default="resources/gguf/qwen2.5-coder-1.5b-instruct.gguf")
    parser.add_argument("--domains", nargs="+", default=["code", "factual", "dialogue", "prose"])
    parser.add_argument("--prompts", type=int, default=5, help="prompts a domain (the first ones)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="one row per run (CSV, written atomically)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = read_gguf(args.target)
    full = LeanLM(model, max_length=2048)
    fast = LeanLM(model, max_length=2048)
    start = time.perf_counter()
    fast.use_argmax_head()
    print(f"argmax head built in {time.perf_counter() - start:.1f} s: its first pass reads "
          f"{fast.argmax_head.nbytes / 1e6:.0f} MB against the head's {model.output.nbytes / 1e6:.0f} MB")
    sessions = {"full": full, "argmax": fast}
    first = torch.tensor([list(pd.read_parquet(f"{args.prompts_dir}/{args.domains[0]}.parquet").input_ids[0])])
    for session in sessions.values():  # warm-up, not recorded
        generate_baseline(session, first, 8)
    fast.argmax_head.candidates.clear()
    fast.argmax_head.full_head_calls = 0
    frame = (run_pairs if args.mode == "runs" else step_pairs)(args, sessions)
    if args.out:
        write_csv(frame, args.out)
    for domain, group in [*frame.groupby("domain", sort=False), ("all", frame)]:
        median, low, high = bootstrap_median_interval(group["ratio"].to_numpy())
        line = (f"{domain}: argmax / full head {median:.3f} [{low:.3f}, {high:.3f}] over {len(group)} "
                f"{args.mode}; ")
        if args.mode == "runs":
            line += (f"full {group['full_tokens_per_s'].median():.2f} tok/s; identical "
                     f"{int(group['identical'].sum())}/{len(group)}")
        else:
            line += (f"step {group['full_seconds'].median() * 1e3:.2f} ms; head {group['full_head'].median() * 1e3:.2f}"
                     f" -> {group['argmax_head'].median() * 1e3:.2f} ms")
        print(line)
    counts = np.array(fast.argmax_head.candidates)
    print(f"candidate rows a step: median {np.median(counts):.0f}, 90th percentile {np.percentile(counts, 90):.0f}, "
          f"largest {counts.max()}; {fast.argmax_head.full_head_calls} of {len(counts)} steps ran the whole head")


if __name__ == "__main__":
    main()
