# SpecDec: exact speculative decoding, verified and measured. `snakemake --cores 2` runs the whole study.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config.yaml"


# every rule runs in the one pinned environment (used with `--sdm conda`)
SPECDEC_ENV = "../../envs/specdec.yaml"  # relative to workflow/rules/, where every rule lives


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/prompts.smk"
include: "workflow/rules/decode.smk"
include: "workflow/rules/verify.smk"
include: "workflow/rules/sweep.smk"
include: "workflow/rules/costmodel.smk"
include: "workflow/rules/peers.smk"
include: "workflow/rules/distill.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        "results/tables/greedy_identity.csv",
        "results/tables/study.csv",
        "results/tables/study.md",
        "results/plots/acceptance_heatmap.png",
        "results/plots/speedup_vs_k.png",
        "results/provenance.yaml",
        ["results/tables/distribution.csv"] if DISTRIBUTION and distribution_drafts() else [],
        ["results/tables/costmodel.csv"] if PROFILING else [],
        ["results/tables/peers.csv"] if PEERS and peers_drafts() else [],
    default_target: True
