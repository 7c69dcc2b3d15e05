"""The README's headline table, made from the committed tables so that it cannot drift from them: per CPU type, our
exact plain decoding and our best speculative decoding against plain llama.cpp on the same GGUF files and prompts
(every side-by-side run of that CPU type, `vs_llamacpp`), and the fp32 study's speedups per domain.

`python -m specdec.study.report.headline` prints it; `--check README.md` exits 1 where the README's copy (between the
markers below) differs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import yaml

from specdec.study.machine import CPU_TYPES, cpu_type

BEGIN, END = "<!-- headline: begin (python -m specdec.study.report.headline) -->", "<!-- headline: end -->"
DOMAINS = ("code", "factual", "prose", "dialogue")


def side_by_side_runs(results: Path) -> pd.DataFrame:
    """Every committed side-by-side table with its machine (read from the run's provenance): our engine's rows."""
    frames = []
    for provenance in sorted(results.glob("**/vs_llamacpp/provenance.yaml")):
        table = provenance.parent.parent / "tables" / "vs_llamacpp.csv"
        if not table.is_file():
            continue
        machine = yaml.safe_load(provenance.read_text())["machine"]["id"]
        rows = pd.read_csv(table)
        frames.append(rows[rows["engine"] == "specdec"].assign(cpu=cpu_type(machine), source=str(table)))
    return pd.concat(frames, ignore_index=True)


def _span(values) -> str:
    low, high = min(values), max(values)
    return f"{low:.2f}" if round(low, 2) == round(high, 2) else f"{low:.2f}–{high:.2f}"


def llamacpp_rows(runs: pd.DataFrame) -> list[dict]:
    """Per CPU type: our plain over llama.cpp's plain (range over domains and runs); our best speculative over it on
    code (its draft and k) and on the other domains (range of each domain's best). Where a CPU type has runs with
    more timing repeats a prompt, only those count (a one-repeat median moved by 0.2-0.3 between runs)."""
    out = []
    for cpu, rows in runs.groupby("cpu", sort=False):
        rows = rows[rows["n_repeats"] == rows["n_repeats"].max()]
        plain = rows[rows["draft"] == "plain"]
        spec = rows[rows["draft"] != "plain"]
        best = spec.loc[spec.groupby("domain")["spec_ratio"].idxmax()].set_index("domain")
        code = best.loc["code"]
        others = [best.loc[d, "spec_ratio"] for d in DOMAINS[1:] if d in best.index]
        out.append({"cpu": cpu, "plain": _span(plain["plain_ratio"]),
                    "code": f"{code['spec_ratio']:.2f} ({_draft_name(code['draft'])}, k {int(code['k'])})",
                    "others": _span(others)})
    order = list(CPU_TYPES.values())
    return sorted(out, key=lambda r: order.index(r["cpu"]) if r["cpu"] in order else len(order))


def _draft_name(draft: str) -> str:
    return {"qwen2.5-coder-0.5b-instruct": "0.5B", "lookup": "lookup", "coder-0.5b-hybrid-gguf": "hybrid",
            "coder-0.5b-v64k": "0.5B over 64k ids",
            "coder-0.5b-long-lookup": "long lookups, else 0.5B over 64k ids",
            "coder-0.5b-v64k-q5": "0.5B over 64k ids, Q5_0 head",
            "coder-0.5b-q5-long-lookup": "long lookups, else 0.5B over 64k ids with a Q5_0 head"}.get(draft, draft)


def study_speedups(study: Path) -> dict[str, str]:
    """The fp32 study's greedy speedup per domain at its best k (median, 95% bootstrap interval)."""
    table = pd.read_csv(study)
    greedy = table[table["temperature"] == 0]
    best = greedy.loc[greedy.groupby("domain")["speedup_median"].idxmax()].set_index("domain")
    return {d: f"{best.loc[d, 'speedup_median']:.2f} [{best.loc[d, 'speedup_lo']:.2f}, {best.loc[d, 'speedup_hi']:.2f}]"
               f" (k {int(best.loc[d, 'k'])})" for d in DOMAINS if d in best.index}


def headline(results: Path = Path("results")) -> str:
    header = "| CPU type | our plain / llama.cpp plain | our best speculative / llama.cpp plain: code | other domains |"
    lines = [header, "|---|---|---|---|"]
    lines += [f"| {r['cpu']} | {r['plain']} | {r['code']} | {r['others']} |"
              for r in llamacpp_rows(side_by_side_runs(results))]
    speedups = study_speedups(results / "study" / "tables" / "study.csv")
    lines += ["", "| fp32 study, AMD EPYC Zen 3, speedup over plain | " + " | ".join(speedups) + " |",
              "|---|" + "---|" * len(speedups),
              "| 32 new tokens, greedy | " + " | ".join(speedups.values()) + " |"]
    return "\n".join(lines)


def readme_copy(text: str) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip("\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--check", type=Path, metavar="README", help="exit 1 if README's copy differs")
    args = parser.parse_args(argv)
    table = headline(args.results)
    if args.check:
        if readme_copy(args.check.read_text()) != table:
            print(f"{args.check}: the headline table differs from the committed tables; paste:\n{table}",
                  file=sys.stderr)
            return 1
        return 0
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
