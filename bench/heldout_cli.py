"""The check a new user would make: the command line on prompts outside the study, each draft against plain decoding.

    python bench/heldout_cli.py --prompts experiments/cpu-lead/heldout_prompts.yaml \
        [--target resources/gguf/qwen2.5-coder-1.5b-instruct.gguf] [--draft-file resources/gguf/qwen2.5-coder-0.5b-instruct.gguf]
        [--drafts model:2 model-v65536:2 lookup:2] [--max-new-tokens 128] [--out heldout.csv]

Each prompt (a YAML list of {category, prompt}) runs `python -m specdec generate --baseline --json` once per draft,
in a process of its own as a user's would (plain decoding first, then speculative, in that process): the speedup over
plain decoding, greedy identity, acceptance, tokens per target pass and the prompt's length. Drafts: KIND:K with KIND
`model` (the draft file), `model-vN` (the draft file, its head limited to the first N ids), `lookup` (prompt lookup),
`hybrid` (lookup, else the draft file), or a YAML file of the draft's kind and fields (`--draft-spec`; the draft
file goes with it where the kind loads a model), e.g. experiments/cpu-lead/long-lookup-hybrid.yaml:6.
Prints each run and the medians per draft; --out writes one row per run
(CSV, atomically). Run it alone on the machine."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pandas as pd
import yaml

from specdec.drafts import get_kind
from specdec.study.io import write_csv
from specdec.study.stats import bootstrap_median_interval


def draft_arguments(draft: str, draft_file: str) -> list[str]:
    """The command line's draft options for KIND:K (module docstring)."""
    kind, _, k = draft.partition(":")
    if not k.isdigit() or int(k) < 1:
        raise ValueError(f"draft {draft!r}: expected KIND:K with K a positive integer")
    if kind == "model":
        args = ["--draft", draft_file]
    elif kind.startswith("model-v") and kind[len("model-v"):].isdigit():
        args = ["--draft", draft_file, "--draft-option", f"vocab={kind[len('model-v'):]}"]
    elif kind == "lookup":
        args = ["--draft-kind", "prompt_lookup"]
    elif kind == "hybrid":
        args = ["--draft-kind", "hybrid", "--draft", draft_file]
    elif kind.endswith((".yaml", ".yml")):
        with open(kind) as f:
            spec = yaml.safe_load(f)
        if not isinstance(spec, dict) or "kind" not in spec:
            raise ValueError(f"draft {draft!r}: {kind} is not a YAML mapping with a `kind`")
        # the command line's own rule: a kind that loads a model takes it as --draft
        args = ["--draft-spec", kind] + (["--draft", draft_file] if get_kind(spec["kind"]).model is not None else [])
    else:
        raise ValueError(f"draft {draft!r}: KIND is one of model, model-vN, lookup, hybrid or a spec.yaml")
    return [*args, "--k", k]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--target", default="resources/gguf/qwen2.5-coder-1.5b-instruct.gguf")
    parser.add_argument("--draft-file", default="resources/gguf/qwen2.5-coder-0.5b-instruct.gguf")
    parser.add_argument("--drafts", nargs="+", default=["model:2", "lookup:2"])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    prompts = yaml.safe_load(open(args.prompts))
    if not isinstance(prompts, list) or not all(isinstance(p, dict) and {"category", "prompt"} <= set(p)
                                                  for p in prompts):
        parser.error(f"{args.prompts}: expected a YAML list of {{category, prompt}}")
    try:
        drafts = {draft: draft_arguments(draft, args.draft_file) for draft in args.drafts}
    except ValueError as e:
        parser.error(str(e))
    rows = []
    for index, item in enumerate(prompts):
        for draft, options in drafts.items():
            cmd = [sys.executable, "-m", "specdec", "generate", "--target", args.target, *options, "--baseline",
                   "--json", "--max-new-tokens", str(args.max_new_tokens), "--threads", str(args.threads),
                   "--prompt", item["prompt"]]
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode not in (0, 1):  # 1: greedy identity violated, which is a result to record
                sys.exit(f"prompt {index} ({item['category']}), draft {draft}: the command failed "
                         f"(exit {run.returncode}):\n{run.stderr[-2000:]}")
            out = json.loads(run.stdout)
            row = {"prompt": index, "category": item["category"], "draft": draft,
                   "prompt_tokens": out["prompt_tokens"], "new_tokens": out["n_tokens"],
                   "baseline_seconds": out["baseline_seconds"], "seconds": out["total_seconds"],
                   "speedup": out["speedup"], "greedy_identical": out["greedy_identical"],
                   "acceptance": out["acceptance"], "tokens_per_pass": out["tokens_per_pass"],
                   "baseline_tokens_per_s": out["n_tokens"] / out["baseline_seconds"]}
            rows.append(row)
            print(f"{index:2d} {item['category']:18s} {draft:14s} prompt {row['prompt_tokens']:4d} tokens: "
                  f"{row['speedup']:.2f}x, identical {row['greedy_identical']}, acceptance {row['acceptance']:.2f}",
                  flush=True)
    frame = pd.DataFrame(rows)
    for draft, group in frame.groupby("draft", sort=False):
        median, lo, hi = bootstrap_median_interval(group["speedup"].to_numpy())
        print(f"{draft}: speedup over plain decoding {median:.2f} [{lo:.2f}, {hi:.2f}] (best {group.speedup.max():.2f}), "
              f"greedy identity {int(group.greedy_identical.sum())}/{len(group)}, plain decoding "
              f"{group.baseline_tokens_per_s.median():.1f} tokens/s")
    if args.out:
        write_csv(frame, args.out)


if __name__ == "__main__":
    main()
