"""Our engine and llama.cpp side by side in one job, on the same GGUF files, threads and prompts: per prompt (and
repeat) our plain decoding, our speculative decoding with each draft, llama.cpp's plain run and its speculative run,
back to back in rotating order (interleave.run_in_rotation), so a speed ratio is a ratio of runs taken within a
minute of each other on the same machine state.

Rates are over the generation phase only, the prompt's pass left out, as llama.cpp reports them: ours are
(tokens - 1) / (wall time after the prefill pass that chose the first token); llama.cpp plain is 1 / (eval ms per
one-token step + sampling ms per token) and llama.cpp speculative n_predict / the decode loop's seconds (its own
counters: a fresh process per run, so its model load is never counted).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import pandas as pd

from specdec.study.verify.divergence import first_difference
from specdec.study.decoding.interleave import WARMUP_TOKENS, batch_of_one, run_in_rotation
from specdec.study.decoding.jobs import baseline_or_speculative
from specdec.study.progress import Progress
from specdec.study.stats import bootstrap_median_interval

SPECDEC, LLAMACPP = "specdec", "llama.cpp"
PLAIN = "plain"
RATIO_COLUMNS = [f"{name}{suffix}" for name in ("plain_ratio", "spec_ratio") for suffix in ("", "_lo", "_hi")]
TABLE_COLUMNS = ["engine", "draft", "domain", "k", "n_prompts", "n_repeats", "max_new_tokens", *RATIO_COLUMNS,
                 "speedup", "speedup_lo", "speedup_hi", "tokens_per_s", "plain_tokens_per_s",
                 "llamacpp_plain_tokens_per_s", "acceptance", "tokens_per_pass", "n_identical", "n_compared",
                 "n_same_prompt_ids"]


@dataclass(frozen=True)
class Method:
    """One way to decode a prompt: an engine, and its draft and k (PLAIN and 0 for plain decoding)."""

    engine: str
    draft: str = PLAIN
    k: int = 0

    @property
    def plain(self) -> bool:
        return self.draft == PLAIN

    def __str__(self) -> str:
        return f"{self.engine} {self.draft}" + ("" if self.plain else f" k{self.k}")


def methods_for(drafts: Mapping[str, int], llamacpp_draft: str | None, llamacpp_k: int) -> list[Method]:
    """Our plain, ours with each draft at its k, llama.cpp plain, llama.cpp with its draft at its k (none where
    llamacpp_draft is None)."""
    llama_spec = [Method(LLAMACPP, llamacpp_draft, int(llamacpp_k))] if llamacpp_draft is not None else []
    return [Method(SPECDEC), *(Method(SPECDEC, name, int(k)) for name, k in drafts.items()),
            Method(LLAMACPP), *llama_spec]


def generation_rate(result) -> tuple[float, float]:
    """(tokens/s, seconds) of one of our runs after its prefill pass: the tokens after the first over the wall time
    after the pass that chose it (its draft prefill, verify and decision)."""
    first = result.steps[0]
    seconds = result.total_seconds - (first.draft_seconds + first.verify_seconds + first.decide_seconds)
    n = len(result.tokens) - 1
    return (n / seconds if n > 0 and seconds > 0 else float("nan")), seconds


def run_ours(method: Method, input_ids, max_new_tokens: int, *, target, proposers: Mapping[str, object]) -> dict:
    result = baseline_or_speculative(None if method.plain else method.k, target, proposers.get(method.draft),
                                     input_ids, max_new_tokens)
    rate, seconds = generation_rate(result)
    return {"tokens": list(result.tokens), "n_tokens": len(result.tokens), "tokens_per_second": rate,
            "generation_seconds": seconds, "acceptance": result.acceptance if not method.plain else float("nan"),
            "tokens_per_pass": result.tokens_per_pass, "drafted": result.drafted, "accepted": result.accepted,
            "target_passes": result.target_passes}


def llamacpp_row(method: Method, parsed: Mapping) -> dict:
    """Our row's fields from llama.cpp's parsed output (llamacpp.decode_run): its emitted pieces stand in for tokens
    (compared with its own plain run's); tokens per pass = 1 + accepted / verify passes, as its '#mean acc len'."""
    row = {"tokens": list(parsed["pieces"]), "n_tokens": int(parsed["n_emitted"]),
           "tokens_per_second": float(parsed["tokens_per_second"]), "prompt_ids": list(parsed.get("prompt_ids", [])),
           "process_seconds": float(parsed.get("process_seconds", float("nan")))}
    if method.plain:
        return {**row, "acceptance": float("nan"), "tokens_per_pass": 1.0, "drafted": 0, "accepted": 0}
    drafted, accepted = int(parsed["n_drafted"]), int(parsed["n_accept"])
    return {**row, "acceptance": accepted / drafted if drafted else float("nan"),
            "tokens_per_pass": 1.0 + int(parsed["n_acc_tokens"]) / max(int(parsed["n_call_accept"]), 1),
            "drafted": drafted, "accepted": accepted}


def side_by_side_job(prompts: pd.DataFrame, methods: Sequence[Method], *, run_ours: Callable[..., dict],
                     run_llamacpp: Callable[[Method, object, int], dict], max_new_tokens: int, repeats: int = 1,
                     log: Callable[[str], None] = print) -> pd.DataFrame:
    """Every method on every prompt and repeat, in rotating order. run_ours(method, input_ids, n) and
    run_llamacpp(method, prompt_row, n) return a row (llamacpp_row / run_ours's fields). Our methods are warmed up on
    the first prompt first (allocation, first-call costs; not recorded). One row per run, each with `identical`:
    its tokens equal its own engine's plain run's within max_new_tokens (first_diff where they do not)."""
    first_ids = batch_of_one(prompts.iloc[0]["input_ids"])
    for method in methods:
        if method.engine == SPECDEC:
            run_ours(method, first_ids, WARMUP_TOKENS)
    progress = Progress(len(prompts) * repeats * len(methods), "runs")
    rows = []
    try:
        for index, prompt in enumerate(prompts.itertuples(index=False)):
            input_ids = batch_of_one(prompt.input_ids)
            for repeat in range(repeats):
                def run(method, prompt=prompt, input_ids=input_ids):
                    if method.engine == SPECDEC:
                        out = run_ours(method, input_ids, max_new_tokens)
                    else:
                        out = run_llamacpp(method, prompt, max_new_tokens)
                    progress.update(tokens=out["n_tokens"], note=f"{prompt.prompt_id} r{repeat} {method}")
                    return out

                results = run_in_rotation(list(methods), index + repeat, run)
                plain = {m.engine: r for m, r in results.items() if m.plain}
                for order, (method, out) in enumerate(results.items()):
                    first = first_difference(out["tokens"], plain[method.engine]["tokens"], max_new_tokens)
                    ids = out.pop("prompt_ids", None)
                    rows.append({"prompt_id": prompt.prompt_id, "repeat": repeat, "order": order,
                                 "engine": method.engine, "draft": method.draft, "k": method.k,
                                 "n_prompt_tokens": len(prompt.input_ids), **out, "first_diff": first,
                                 "identical": first is None,
                                 "same_prompt_ids": (list(ids) == [int(t) for t in prompt.input_ids]) if ids else None})
                log(f"[{index + 1}/{len(prompts)} r{repeat}] {prompt.prompt_id}: " + "; ".join(
                    f"{m} {r['tokens_per_second']:.2f} tok/s" for m, r in results.items()))
    finally:
        progress.close()
    frame = pd.DataFrame(rows)
    frame["tokens"] = frame["tokens"].map(lambda t: [str(x) for x in t])  # ids and pieces alike, one column type
    return frame


def summarize(runs: pd.DataFrame, max_new_tokens: int, seed: int = 0) -> pd.DataFrame:
    """One row per (engine, draft, domain, k) of speculative runs, and one per engine's plain runs (draft 'plain').

    Per prompt and repeat (one turn, minutes apart at most): plain_ratio = our plain tokens/s / llama.cpp plain
    tokens/s of the same turn; spec_ratio = this row's tokens/s / llama.cpp plain's; speedup = this row's tokens/s /
    its own engine's plain. Each the median over turns with a 95% bootstrap interval. acceptance and tokens per pass
    pooled over the cell's runs; n_identical of n_compared: runs whose tokens equal their engine's plain run's."""
    keys = ["prompt_id", "repeat"]
    rows = []
    for domain, cell in runs.groupby("domain", sort=False):
        rate = {(e, d, k): g.set_index(keys)["tokens_per_second"]
                for (e, d, k), g in cell.groupby(["engine", "draft", "k"], sort=False)}
        llama_plain, our_plain = rate[(LLAMACPP, PLAIN, 0)], rate[(SPECDEC, PLAIN, 0)]
        plain_ratio = bootstrap_median_interval((our_plain / llama_plain.reindex(our_plain.index)).to_numpy(),
                                                seed=seed)
        for (engine, draft, k), group in cell.groupby(["engine", "draft", "k"], sort=False):
            own = rate[(engine, draft, k)]
            row = {"engine": engine, "draft": draft, "domain": domain, "k": int(k),
                   "n_prompts": group["prompt_id"].nunique(), "n_repeats": group["repeat"].nunique(),
                   "max_new_tokens": int(max_new_tokens)}
            row.update(zip(RATIO_COLUMNS[:3], plain_ratio))
            row.update(zip(RATIO_COLUMNS[3:], bootstrap_median_interval(
                (own / llama_plain.reindex(own.index)).to_numpy(), seed=seed)))
            plain = rate[(engine, PLAIN, 0)]
            row.update(zip(["speedup", "speedup_lo", "speedup_hi"],
                           bootstrap_median_interval((own / plain.reindex(own.index)).to_numpy(), seed=seed)))
            drafted = group["drafted"].sum()
            row.update({"tokens_per_s": float(own.median()), "plain_tokens_per_s": float(plain.median()),
                        "llamacpp_plain_tokens_per_s": float(llama_plain.median()),
                        "acceptance": group["accepted"].sum() / drafted if drafted else float("nan"),
                        "tokens_per_pass": float(group["tokens_per_pass"].mean()),
                        "n_identical": int(group["identical"].sum()), "n_compared": len(group),
                        "n_same_prompt_ids": int(group["same_prompt_ids"].fillna(False).astype(bool).sum())})
            rows.append(row)
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def format_ratios(table: pd.DataFrame) -> str:
    """The table's ratios as the benchmark command prints them, one line per row."""
    lines = [f"{'engine':10} {'draft':32} {'domain':9} {'k':>2}  {'ours/llama plain':>22}  "
             f"{'this/llama plain':>22}  {'speedup':>7}  {'tok/pass':>8}  identical"]
    for r in table.itertuples(index=False):
        lines.append(f"{r.engine:10} {r.draft:32} {r.domain:9} {r.k:>2}  "
                     f"{r.plain_ratio:6.2f} [{r.plain_ratio_lo:.2f}, {r.plain_ratio_hi:.2f}]  "
                     f"{r.spec_ratio:6.2f} [{r.spec_ratio_lo:.2f}, {r.spec_ratio_hi:.2f}]  {r.speedup:7.2f}  "
                     f"{r.tokens_per_pass:8.2f}  {r.n_identical}/{r.n_compared}")
    return "\n".join(lines)


def llamacpp_runner(bin_dir, target_file, draft_file, settings, workdir: str | Path,
                    raw: Callable[[str, str], None] | None = None) -> Callable[[Method, object, int], dict]:
    """run_llamacpp for side_by_side_job: one llama.cpp process per run (plain or speculative), on the prompt's
    chat text written once per prompt under workdir."""
    from specdec.study.peers.llamacpp.commands import write_prompt
    from specdec.study.peers.llamacpp.runs import PLAIN as LLAMA_PLAIN
    from specdec.study.peers.llamacpp.runs import decode_run

    files: dict[str, Path] = {}

    def run(method: Method, prompt, max_new_tokens: int) -> dict:
        if prompt.prompt_id not in files:
            files[prompt.prompt_id] = write_prompt(prompt.chat_text, Path(workdir) / f"prompt{len(files)}.txt")
        parsed = decode_run(LLAMA_PLAIN if method.plain else method.k, bin_dir=bin_dir, target=target_file,
                             draft=draft_file, prompt_file=files[prompt.prompt_id],
                             settings=replace(settings, max_new_tokens=max_new_tokens), raw=raw,
                             label=str(prompt.prompt_id))
        return llamacpp_row(method, parsed)

    return run


def ours_runner(target, proposers: Mapping[str, object]) -> Callable[..., dict]:
    return partial(run_ours, target=target, proposers=proposers)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m specdec.study.peers.vs_llamacpp [table.csv]`: print the side-by-side table's ratios."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("table", nargs="?", default="results/study-gguf/tables/vs_llamacpp.csv")
    args = parser.parse_args(argv)
    path = Path(args.table)
    if not path.exists():
        raise SystemExit(f"{path} does not exist: run `snakemake --cores 2 --configfile config/gguf.yaml "
                         f"vs_llamacpp` first")
    print(format_ratios(pd.read_csv(path)))


if __name__ == "__main__":
    main()
