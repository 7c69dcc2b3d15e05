"""Before/after of a draft's dtype on the real pair: baseline and speculative decoding with the same draft model in
several dtypes (or the bf16 model with its products chosen the old way), in one process, interleaved (see
specdec/study/decoding/ab.py). Greedy.

    python bench/draft_ab.py --prompts results/study/prompts/code.parquet --count 3 --k 4 8 \
        --variants float32 bfloat16 --out results/study/tables/draft_dtype_ab.csv

Needs the prepared models (snakemake --cores 2 resources/models/<name>) and prompts
(results/study/prompts/<domain>.parquet).
"""

import argparse
import logging
from pathlib import Path

import pandas as pd

from specdec.fp32.kernels import BF16_MAX_ROWS, RowAdaptiveBf16Linear
from specdec.fp32.loading import load_for_decoding
from specdec.load import make_draft
from specdec.runtime import Runtime
from specdec.study.decoding.ab import draft_ab_table, run_draft_ab
from specdec.study.io import write_csv


def fix_bf16_products(proposer) -> None:
    """The choice before 2026-12-01: the one-row backend up to its BF16_MAX_ROWS rows, the fp32 copy beyond."""
    model_draft = getattr(proposer, "model", proposer)  # a hybrid holds its ModelDraft as .model
    for layer in model_draft.session.model.modules():
        if isinstance(layer, RowAdaptiveBf16Linear) and layer.table:
            layer.backend = layer.table[min(layer.table)]
            layer.max_bf16_rows = BF16_MAX_ROWS[layer.backend]
            layer.set_table(None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="resources/models/qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="resources/models/qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--prompts", nargs="+", required=True, help="prompt parquet files (one per domain)")
    parser.add_argument("--count", type=int, default=3, help="first N prompts of each file")
    parser.add_argument("--k", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--variants", nargs="+", default=["float32", "bfloat16"],
                        help="draft dtypes to compare; bfloat16-fixed: bf16 with the products chosen before "
                             "2026-12-01 (the one-row backend up to its BF16_MAX_ROWS, the fp32 copy beyond)")
    parser.add_argument("--kind", choices=["model", "hybrid"], default="model",
                        help="the draft: the model alone, or the hybrid (prompt lookup, else the model)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True, help="CSV of the summary; the per-run rows go next to it (.runs.csv)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    runtime = Runtime(threads=args.threads)
    target, tokenizer = load_for_decoding(args.target, runtime)
    drafts = {variant: make_draft(f"draft-{variant}", {"kind": args.kind, "model": "draft", "ngram_max": 3,
                                                       "dtype": variant.removesuffix("-fixed")},
                                  target, tokenizer, args.draft, runtime)
              for variant in args.variants}
    for variant, draft in drafts.items():
        if variant.endswith("-fixed"):
            fix_bf16_products(draft)
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
