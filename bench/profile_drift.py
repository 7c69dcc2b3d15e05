"""How much the cost-model fit moves when the fit's models are profiled one after the other ("separate", what
profile_model did per model in its own job) or interleaved repeat by repeat ("interleaved", profile_fit_models),
alternating the two modes in one process for a few rounds: per-layer overhead, effective bandwidth, the overhead
share s of the target's step and the draft's c, per round (docs/costmodel.md, "Profiles and fits"). Run it alone.

    python bench/profile_drift.py --kernels results/machines/<machine>/auto/kernels --rounds 3 --out drift.csv
"""

import argparse
import time
from pathlib import Path

import pandas as pd

from specdec.fp32.loading import load_for_decoding
from specdec.runtime import Runtime
from specdec.study.cost.model import fit_cost_model, profiled_shapes
from specdec.study.io import read_backend_tables
from specdec.study.cost.verdict import MachineFit
from specdec.study.cost.prediction import forward_seconds
from specdec.study.cost.profiling import profile_model, profile_models

MODELS = ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"]  # draft, target: the fit's pair


def fit_row(mode: str, round_: int, tables: dict[str, pd.DataFrame], target: str) -> dict:
    profiles = pd.concat(tables.values(), ignore_index=True)
    fit = fit_cost_model(profiles, n_boot=200)
    summary = MachineFit("this", "auto", fit.terms, None, profiled_shapes(profiles)[target], pd.DataFrame()).summary()
    one = {name: t[t["m"] == 1] for name, t in tables.items()}
    draft, = set(tables) - {target}
    forward = forward_seconds(profiles)
    return {"mode": mode, "round": round_, "time": time.strftime("%H:%M:%S"),
            **{key: summary[key] for key in ("per_layer_overhead_ms", "per_layer_overhead_ms_lo",
                                             "per_layer_overhead_ms_hi", "bandwidth_eff_gb_s", "overhead_share")},
            **{f"layer_ms_{name}": 1e3 * t[t["component"] == "layer"]["seconds"].median() for name, t in one.items()},
            "c": forward.loc[(draft, 1)] / forward.loc[(target, 1)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models-dir", default="resources/models")
    parser.add_argument("--kernels",
                        help="the machine's kernel tables (runtime.linear_kernel auto); none: weight_major")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runtime = Runtime(threads=args.threads, linear_kernel="auto" if args.kernels else "weight_major")
    models = {name: load_for_decoding(f"{args.models_dir}/{name}", runtime,
                                      read_backend_tables(f"{args.kernels}/{name}.csv" if args.kernels else None))[0]
              for name in MODELS}
    settings = {"context_length": 256, "positions": list(range(1, 10)), "repeats": args.repeats, "warmup": 1}
    rows = []
    for round_ in range(args.rounds):
        for mode in (("separate", "interleaved") if round_ % 2 == 0 else ("interleaved", "separate")):
            tables = ({name: profile_model(model, name=name, **settings) for name, model in models.items()}
                      if mode == "separate" else profile_models(models, **settings))
            rows.append(fit_row(mode, round_, tables, MODELS[-1]))
            print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    table.to_csv(args.out, index=False)
    print(table.groupby("mode")[["per_layer_overhead_ms", "bandwidth_eff_gb_s", "overhead_share", "c"]]
          .agg(["min", "median", "max"]).to_string())


if __name__ == "__main__":
    main()
