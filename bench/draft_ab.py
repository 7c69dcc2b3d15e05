"""Before/after of a draft's dtype on the real pair: baseline and speculative decoding with the same draft model in
several dtypes, in one process, interleaved (see specdec/ab.py). Greedy.

    python bench/draft_ab.py --prompts results/prompts/code.parquet --count 3 --k 4 8 \
        --variants float32 bfloat16 --out results/tables/draft_dtype_ab.csv

Needs the prepared models (snakemake --cores 2 resources/models/<name>) and prompts (results/prompts/<domain>.parquet).
"""

import argparse
import logging
from pathlib import Path

import pandas as pd

from specdec.drafts import ModelDraft
from specdec.loading import Runtime, load_for_decoding
from specdec.study.ab import draft_ab_table, run_draft_ab
from specdec.study.io import write_csv
from specdec.study.jobs import load_draft_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="resources/models/qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="resources/models/qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--prompts", nargs="+", required=True, help="prompt parquet files (one per domain)")
    parser.add_argument("--count", type=int, default=3, help="first N prompts of each file")
    parser.add_argument("--k", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--variants", nargs="+", default=["float32", "bfloat16"], help="draft dtypes to compare")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True, help="CSV of the summary; the per-run rows go next to it (.runs.csv)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    runtime = Runtime(threads=args.threads)
    target, tokenizer = load_for_decoding(args.target, runtime)
    drafts = {dtype: ModelDraft(load_draft_model(f"draft-{dtype}", {"dtype": dtype}, args.draft, tokenizer, runtime))
              for dtype in args.variants}
    tables, all_runs = [], []
    for path in args.prompts:
        domain = Path(path).stem
        prompts = pd.read_parquet(path).head(args.count)
        runs = run_draft_ab(target, drafts, prompts, args.k, args.max_new_tokens,
                            log=lambda msg: logging.info("%s %s", domain, msg))
        table = draft_ab_table(runs)
        table.insert(0, "domain", domain)
        runs.insert(0, "domain", domain)
        tables.append(table)
        all_runs.append(runs)
        print(table.to_string(index=False), flush=True)
    write_csv(pd.concat(tables, ignore_index=True), args.out)
    write_csv(pd.concat(all_runs, ignore_index=True), str(Path(args.out).with_suffix(".runs.csv")))


if __name__ == "__main__":
    main()
