"""Snakemake script: llama.cpp's CLI tools built from the vendored sources of the pinned sdist (CMake, Release,
native CPU flags) into resources/llamacpp/<version>/ with manifest.json. A missing tool or a failed build ends the
job with one line on the terminal naming what is missing and where the build log is."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging
import sys

from specdec.study.peers.llamacpp import LlamaCppBuildError, build_llamacpp
from specdec.study.logs import log_to

log = logging.getLogger("llamacpp_build")


def main(snakemake):
    s = snakemake.params.settings
    try:
        with log_to(snakemake.log.script):
            manifest = build_llamacpp(
                snakemake.input[0], snakemake.output[0], version=s["version"], sha256=s["sha256"],
                build_log=snakemake.log.cmake, cmake=s["cmake"], cc=s["cc"], cxx=s["cxx"],
                jobs=max(1, int(snakemake.threads)), extra_flags=list(s.get("cmake_flags") or []), log=log.info)
            log.info("manifest: %s", manifest)
    except LlamaCppBuildError as e:
        print(f"specdec: llamacpp_build: {e}", file=sys.__stderr__, flush=True)
        sys.exit(1)


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
