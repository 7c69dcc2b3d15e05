"""Snakemake script: fit the cost model on this machine's profiles alone (no decode run needed) and keep it with
them (results/machines/{machine}/{kernel}/): the terms, T(m)/T(1), the profiled shapes and, for every configured
draft, its depth and bytes ratios with c predicted by the fit and c measured as profiled forwards where the profiles
hold its step (other models' profiles found there count for that, not for the fit, which is made on the study's
models on every machine). What the cross-machine verdict (`machines`) and the best draft per machine read."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging
from dataclasses import asdict

import pandas as pd

from specdec.drafts import load_plugins
from specdec.study.cost.model import fit_cost_model, predict_draft_cost_ratio, profiled_shapes
from specdec.study.io import read_parquets, write_csv
from specdec.study.logs import log_to
from specdec.study.cost.prediction import fitted_draft_costs

log = logging.getLogger("machine_fit")


def shapes_table(shapes: dict) -> pd.DataFrame:
    return (pd.DataFrame([{"model": name, **asdict(shape)} for name, shape in shapes.items()])
            .rename(columns={"hidden": "hidden_size", "intermediate": "intermediate_size", "vocab": "vocab_size"}))


def main(snakemake):
    with log_to(snakemake.log[0]):
        inputs, outputs, params = snakemake.input, snakemake.output, snakemake.params
        load_plugins(params.plugins)
        profiles = read_parquets(inputs.profiles)
        everything = read_parquets([*inputs.profiles, *inputs.others, *inputs.heads])
        shapes = profiled_shapes(profiles)
        fit = fit_cost_model(profiles, n_boot=int(params.n_boot))
        target = shapes[params.target]
        drafts = fitted_draft_costs(everything, params.target, dict(params.draft_specs),
                                    lambda shape: predict_draft_cost_ratio(fit, shape, target),
                                    profiled_dtype=params.runtime_dtype)
        log.info("fit at m = 1:\n%s\ndrafts:\n%s", fit.terms[fit.terms["m"] == 1].to_string(index=False),
                 drafts.to_string(index=False))
        write_csv(fit.terms, outputs.terms)
        write_csv(fit.verify, outputs.verify)
        write_csv(shapes_table(shapes), outputs.shapes)
        write_csv(drafts, outputs.drafts)


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
