"""Do our engine and llama.cpp decode the same GGUF file to the same greedy text? (issue 25, item 4: llama.cpp's side)

    python bench/llamacpp_agreement.py [--runs results/study-gguf/vs_llamacpp/runs] \
        [--out results/study-gguf/tables/llamacpp_agreement.csv]

From the side-by-side job's runs (`vs_llamacpp`: both engines' plain greedy runs of the same prompt token ids):
our tokens decoded to text by the target's tokenizer, llama.cpp's emitted pieces joined, compared character by
character. Per prompt: whether the texts are equal, and how many of llama.cpp's tokens come before the first
differing character (its pieces are its tokens). Both engines round activations to 8 bits per block for these
types; they differ in summation order, so a divergence means a near-tie flipped, or a difference in arithmetic.
Not a timing."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from specdec.study.io import write_csv


def agreeing_pieces(pieces: list[str], text: str) -> int:
    """llama.cpp's tokens whose text lies wholly before the first character where `text` differs from theirs."""
    done, offset = 0, 0
    for piece in pieces:
        if text[offset:offset + len(piece)] != piece:
            break
        offset += len(piece)
        done += 1
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="results/study-gguf/vs_llamacpp/runs")
    parser.add_argument("--tokenizer", default="resources/gguf/qwen2.5-coder-1.5b-instruct.tokenizer")
    parser.add_argument("--out", default="results/study-gguf/tables/llamacpp_agreement.csv")
    args = parser.parse_args()
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(args.tokenizer) / "tokenizer.json"))
    rows = []
    for path in sorted(Path(args.runs).glob("*.parquet")):
        runs = pd.read_parquet(path)
        plain = runs[runs["draft"] == "plain"]
        for (prompt_id, repeat), group in plain.groupby(["prompt_id", "repeat"], sort=False):
            by_engine = group.set_index("engine")
            ours = [int(t) for t in by_engine.loc["specdec", "tokens"]]
            pieces = [str(p) for p in by_engine.loc["llama.cpp", "tokens"]]
            # our end-of-turn token prints as nothing in llama.cpp's output: leave it out of the text
            text = tokenizer.decode(ours, skip_special_tokens=True)
            agree = agreeing_pieces(pieces, text)
            rows.append({"domain": group["domain"].iloc[0], "prompt_id": prompt_id, "repeat": repeat,
                         "our_tokens": len(ours), "llamacpp_tokens": len(pieces),
                         "same_text": text == "".join(pieces), "agreeing_tokens": agree})
    table = pd.DataFrame(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_csv(table, args.out)
    summary = table.groupby("domain", sort=False).agg(
        prompts=("prompt_id", "count"), same_text=("same_text", "sum"),
        median_agreeing_tokens=("agreeing_tokens", "median"), min_agreeing_tokens=("agreeing_tokens", "min"))
    print(summary.to_string())


if __name__ == "__main__":
    main()
