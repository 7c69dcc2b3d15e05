# SpecDec: exact speculative decoding, verified and measured.
#   snakemake --cores 2                                  the study (config.yaml)
#   snakemake --cores 2 --configfile config/quick.yaml   the same DAG, small grid, its own results folder
#   named targets: sweep, peers, reproduce, llamacpp, roofline, bench (see README, config/README.md, bench/README.md)
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config.yaml"


# every rule runs in the one pinned environment (used with `--sdm conda`)
SPECDEC_ENV = "../../envs/specdec.yaml"  # relative to workflow/rules/, where every rule lives
SCHEMA = f"{workflow.basedir}/workflow/schemas/config.schema.yaml"

validate(config, SCHEMA)  # types, ranges, unknown keys; fills in the schema's defaults


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/prompts.smk"
include: "workflow/rules/decode.smk"
include: "workflow/rules/verify.smk"
include: "workflow/rules/costmodel.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/sweep.smk"
include: "workflow/rules/distill.smk"
include: "workflow/rules/feature_head.smk"
include: "workflow/rules/peers.smk"
include: "workflow/rules/reproduce.smk"
include: "workflow/rules/llamacpp.smk"
include: "workflow/rules/bench.smk"


rule all:
    input:
        f"{R}/tables/greedy_identity.csv",
        f"{R}/tables/study.csv",
        f"{R}/tables/study.md",
        f"{R}/plots/acceptance_heatmap.png",
        f"{R}/plots/speedup_vs_k.png",
        f"{R}/provenance.yaml",
        [f"{R}/tables/distribution.csv"] if DISTRIBUTION and distribution_drafts() else [],
        [f"{R}/tables/costmodel.csv", f"{R}/tables/machines.csv", *machine_fit_files()] if COSTMODEL_IN_STUDY else [],
    default_target: True
