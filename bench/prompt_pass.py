"""Time the prompt pass: our lean GGUF engine's forward over a prompt of n positions (one `extend` from an empty
cache) per product kernel, next to llama.cpp's prompt processing (`llama-bench -p n -n 0`) on the same file and
threads, interleaved round by round (each round runs every engine once, in rotating order).

    python bench/prompt_pass.py [--gguf resources/gguf/qwen2.5-coder-1.5b-instruct.gguf] [--n 512] [--rounds 5]
                                [--llamacpp resources/llamacpp/0.3.36] [--no-repack] [--kernels plan avx512-vnni amx]
                                [--out prompt_pass.csv]

`--kernels plan` times the pass on the kernel the file's plan gives a prompt (specdec/gguf/kernel_plan.py: its prompt
kernel, else its step kernel), as a user's prompt runs; the others force that kernel.

The tokens are random ids (a pass's cost does not depend on the values). Prints tokens per second per engine
(median and range over rounds) and our rate over llama.cpp's with a bootstrap interval over rounds; --out writes one
row per engine and round (CSV, atomically). Run it alone on the machine."""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import pandas as pd
import torch

from specdec.gguf import quant
from specdec.gguf.lean import LeanLM
from specdec.study.decoding.interleave import run_in_rotation
from specdec.study.io import write_csv
from specdec.study.machine import machine_id
from specdec.study.peers.llamacpp.parse import parse_bench
from specdec.study.peers.llamacpp.runs import run_tool
from specdec.study.stats import bootstrap_median_interval


def llama_bench_command(bin_dir: Path, gguf: str, n: int, threads: int, repack: bool) -> list[str]:
    """llama-bench's pp<n>: one prompt pass of n positions (no generation), once, JSON lines out."""
    return [str(bin_dir / "llama-bench"), "-m", gguf, "-p", str(n), "-n", "0", "-t", str(threads), "-r", "1",
            "-o", "jsonl", *([] if repack else ["--repack", "0"])]


PLAN = "plan"  # the kernel the model's plan runs a prompt on, unforced


def ours(session: LeanLM, tokens: list[int], kernel: str) -> float:
    """Seconds of one prompt pass (the logits of the last position, as decoding asks for), from an empty cache, on
    `kernel` (PLAN: the session's own choice)."""
    session.reset()
    with contextlib.nullcontext() if kernel == PLAN else quant.use_kernel(kernel):
        start = time.perf_counter()
        session.extend(tokens, 1)
        return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", default="resources/gguf/qwen2.5-coder-1.5b-instruct.gguf")
    parser.add_argument("--n", type=int, default=512, help="prompt positions (llama-bench's pp512: 512)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kernels", nargs="+", default=None,
                        help="our product kernels to time, 'plan' for the file's plan's (default: every one this CPU "
                             "runs)")
    parser.add_argument("--llamacpp", default=None, help="llama.cpp build directory (its bin/llama-bench); none: ours only")
    parser.add_argument("--no-repack", action="store_true",
                        help="llama.cpp with its weight repacking off (an Intel Xeon with AMX: its repacked weights crash)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.n < 1 or args.rounds < 1:
        parser.error("--n and --rounds must be positive")
    torch.set_num_threads(args.threads)
    kernels = args.kernels or list(quant.kernels())
    unknown = sorted(set(kernels) - set(quant.kernels()) - {PLAN})
    if unknown:
        parser.error(f"kernels {unknown} are not product kernels this CPU runs ({', '.join(quant.kernels())})")
    session = LeanLM(args.gguf, max_length=args.n)
    tokens = torch.randint(0, session.vocab_size, (args.n,), generator=torch.Generator().manual_seed(0)).tolist()
    engines = {f"specdec:{kernel}": (lambda kernel=kernel: ours(session, tokens, kernel)) for kernel in kernels}
    if args.llamacpp:
        cmd = llama_bench_command(Path(args.llamacpp) / "bin", args.gguf, args.n, args.threads, not args.no_repack)
        engines["llama.cpp"] = lambda: float(parse_bench(run_tool(cmd).stdout)["avg_s"].iloc[0])
    for run in engines.values():  # warm up: the weights paged in, the AMX state asked for
        run()
    rows = []
    for rnd in range(args.rounds):
        for name, seconds in run_in_rotation(list(engines), rnd, lambda name: engines[name]()).items():
            rows.append({"engine": name, "round": rnd, "n_prompt": args.n, "seconds": seconds,
                         "tokens_per_s": args.n / seconds})
            print(f"round {rnd} {name}: {args.n / seconds:.1f} tokens/s", flush=True)
    frame = pd.DataFrame(rows).assign(gguf=Path(args.gguf).name, threads=args.threads, machine=machine_id(args.threads),
                                      layout=quant.kernel_label())
    print(f"{args.gguf}: prompt of {args.n} positions, {args.threads} threads, {args.rounds} rounds")
    for name, group in frame.groupby("engine", sort=False):
        rate = group["tokens_per_s"]
        print(f"  {name:22s} {rate.median():8.1f} tokens/s [{rate.min():.1f}, {rate.max():.1f}]")
    if "llama.cpp" in engines:
        theirs = frame[frame.engine == "llama.cpp"].set_index("round")["tokens_per_s"]
        for name in engines:
            if name != "llama.cpp":
                ratio = frame[frame.engine == name].set_index("round")["tokens_per_s"] / theirs
                median, lo, hi = bootstrap_median_interval(ratio.to_numpy())
                print(f"  {name} / llama.cpp: {median:.2f} [{lo:.2f}, {hi:.2f}]")
    if args.out:
        write_csv(frame, args.out)


if __name__ == "__main__":
    main()
