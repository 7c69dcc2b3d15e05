"""Plain and speculative decoding on the GGUF pair under each product kernel, in one process, interleaved: per prompt
every (kernel, method) runs back to back, the order rotating from prompt to prompt
(specdec/study/decoding/interleave.py). Greedy. The kernels give the same bits, so every run of a prompt must give the
same tokens (checked); what differs is time. Prints, per kernel and method, generation tokens/s (after the prompt pass,
as the side-by-side job counts them), the median speedup of that phase over the same kernel's plain decoding and over
the first kernel's plain decoding (bootstrap 95% intervals), the prompt pass's time, acceptance and tokens per pass.

    python bench/kernel_ab.py --prompts results/study-gguf/prompts/code.parquet --count 5 --kernels avx512-vnni amx \
        --drafts model:2 model:4 lookup:4 --max-new-tokens 128 \
        --out results/experiments/vs-llamacpp-amx/<machine id>/tables/kernel_ab.csv

Needs the GGUF files (snakemake --cores 2 --configfile config/gguf.yaml resources/gguf/<name>.gguf) and the prompts
(snakemake --cores 2 --configfile config/gguf.yaml results/study-gguf/prompts/code.parquet). Run it alone on the
machine.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import sys
from pathlib import Path

import pandas as pd
import yaml

from specdec.gguf import quant
from specdec.decode import generate_baseline, generate_speculative
from specdec.fp32.kernels import kernel_build
from specdec.load import load_target, make_draft
from specdec.runtime import Runtime
from specdec.study.decoding.interleave import run_interleaved
from specdec.study.io import write_csv
from specdec.study.machine import machine_record
from specdec.study.provenance import model_record, versions
from specdec.study.stats import bootstrap_median_interval
from specdec.study.peers.vs_llamacpp import generation_rate

DRAFT_SPECS = {"model": {"kind": "model", "model": "draft"}, "lookup": {"kind": "prompt_lookup", "ngram_max": 3},
               "hybrid": {"kind": "hybrid", "model": "draft", "ngram_max": 3}}


def parse_draft(text: str) -> tuple[str, int]:
    kind, _, k = text.partition(":")
    if kind not in DRAFT_SPECS or not k.isdigit() or int(k) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a draft is KIND:K with KIND one of {', '.join(DRAFT_SPECS)}")
    return kind, int(k)


def summarise(runs: pd.DataFrame, kernels: list[str]) -> pd.DataFrame:
    """Per (kernel, method, k): speedups per prompt over the kernel's own plain run and over the first kernel's."""
    plain = runs[runs["method"] == "plain"].set_index(["prompt_id", "kernel"])["generation_seconds"]
    rows = []
    for (kernel, method, k), group in runs.groupby(["kernel", "method", "k"], sort=False):
        group = group.set_index("prompt_id")
        own = plain.xs(kernel, level="kernel").reindex(group.index) / group["generation_seconds"]
        first = plain.xs(kernels[0], level="kernel").reindex(group.index) / group["generation_seconds"]
        own_median, own_lo, own_hi = bootstrap_median_interval(own)
        first_median, first_lo, first_hi = bootstrap_median_interval(first)
        rows.append(dict(kernel=kernel, method=method, k=k, n_prompts=len(group),
                         tokens_per_second=float(group["tokens_per_second"].median()),
                         prompt_pass_ms=float(group["prompt_pass_seconds"].median() * 1e3),
                         speedup_own_plain=own_median, speedup_own_plain_lo=own_lo,
                         speedup_own_plain_hi=own_hi, speedup_vs_first_plain=first_median,
                         speedup_vs_first_plain_lo=first_lo, speedup_vs_first_plain_hi=first_hi,
                         acceptance=float(group["acceptance"].median()),
                         tokens_per_pass=float(group["tokens_per_pass"].median()),
                         all_identical=bool(group["identical"].all())))
    return pd.DataFrame(rows)


def write_provenance(args: argparse.Namespace, kernels: list[str], started: str, path: str) -> None:
    """What the table was made from: the command, the machine (CPU, flags), packages, both files' sha256, the
    kernels and the native build."""
    record = {"command": " ".join(["python", *sys.argv]), "started": started,
              "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "machine": machine_record(args.threads), "packages": versions(), "kernels": kernels,
              "kernel_build": kernel_build(),
              "models": {Path(f).name: model_record(f) for f in (args.target, args.draft)}}
    with open(path, "w") as f:
        yaml.safe_dump(record, f, sort_keys=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="resources/gguf/qwen2.5-coder-1.5b-instruct.gguf")
    parser.add_argument("--draft", default="resources/gguf/qwen2.5-coder-0.5b-instruct.gguf")
    parser.add_argument("--prompts", default="results/study-gguf/prompts/code.parquet")
    parser.add_argument("--count", type=int, default=5)
    parser.add_argument("--kernels", nargs="+", default=None, help="product kernels (default: every one this CPU runs)")
    parser.add_argument("--drafts", nargs="+", type=parse_draft, default=[("model", 2), ("model", 4)],
                        help="KIND:K, KIND one of model (the draft file), lookup, hybrid")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True, help="CSV of the summary; the per-run rows go next to it (.runs.csv)")
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    kernels = args.kernels or list(quant.kernels())
    for kernel in kernels:  # refused by name before any model loads
        with quant.use_kernel(kernel):
            pass

    runtime = Runtime(weights="gguf", threads=args.threads)
    prompts = pd.read_parquet(args.prompts).head(args.count)
    longest = int(prompts["input_ids"].map(len).max()) + args.max_new_tokens + 1
    target, vocabulary = load_target(args.target, runtime, None, longest)
    proposers = {kind: make_draft(f"draft-{kind}", dict(DRAFT_SPECS[kind]), target, vocabulary, args.draft, runtime)
                 for kind in dict.fromkeys(kind for kind, _ in args.drafts)}
    methods = [(kernel, "plain", 0) for kernel in kernels] + [(kernel, kind, k) for kernel in kernels
                                                              for kind, k in args.drafts]

    def run(method, input_ids, n):
        kernel, kind, k = method
        with quant.use_kernel(kernel):
            if kind == "plain":
                return generate_baseline(target, input_ids, n)
            return generate_speculative(target, proposers[kind], input_ids, k, n)

    rows = []
    for turn in run_interleaved(prompts, methods, run, args.max_new_tokens, log=logging.info):
        reference = turn.results[kernels[0], "plain", 0].tokens
        for (kernel, kind, k), result in turn.results.items():
            rate, seconds = generation_rate(result)
            rows.append(dict(prompt_id=turn.prompt.prompt_id, kernel=kernel, method=kind, k=k,
                             prompt_tokens=len(turn.prompt.input_ids), tokens=len(result.tokens),
                             tokens_per_second=rate, generation_seconds=seconds,
                             prompt_pass_seconds=result.total_seconds - seconds, acceptance=result.acceptance,
                             tokens_per_pass=result.tokens_per_pass, identical=result.tokens == reference))
    runs = pd.DataFrame(rows).assign(kernel_build=kernel_build())
    table = summarise(runs, kernels)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"), flush=True)
    write_csv(table, args.out)
    write_csv(runs, args.out.removesuffix(".csv") + ".runs.csv")
    write_provenance(args, kernels, started, args.out.removesuffix(".csv") + ".provenance.yaml")


if __name__ == "__main__":
    main()
