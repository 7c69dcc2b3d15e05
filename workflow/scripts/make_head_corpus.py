"""Snakemake script: the feature heads' corpus — chunks of the files of pinned prompt-source archives, each after a
request in the chat template, none sharing a line with an evaluation source's prompts -> one parquet
(specdec/study/training/head_corpus.py).

input:  archives (the parts' prompt-source files: fetched and checked), evaluation (the evaluation's prompt-source
        files, in the order of params.evaluation_sources), tokenizer
params: corpus (feature_head.corpus), prompt_sources, evaluation_sources, download_dir
"""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging

from specdec.study.training.head_corpus import CorpusPart, corpus_table, shared_lines
from specdec.study.io import write_parquet
from specdec.study.logs import log_to
from specdec.study.prepare.prompts import pinned_archive, read_prompt_source

log = logging.getLogger("make_head_corpus")


def main(snakemake):
    with log_to(snakemake.log[0]):
        from transformers import AutoTokenizer

        p = snakemake.params
        corpus = p.corpus
        parts = [CorpusPart(name, spec["file_glob"], spec["instruction"], int(spec["sequences"]))
                 for name, spec in corpus["parts"].items()]
        archives = {name: pinned_archive(p.prompt_sources[spec["archive_of"]], p.download_dir)
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
