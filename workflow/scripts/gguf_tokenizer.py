"""Snakemake script: a GGUF file's tokenizer (vocabulary, merges, special tokens, chat template) saved as a tokenizer
directory, resources/gguf/{model}.tokenizer/: the gguf regime's prompts are encoded with it."""

from specdec.study.interrupt import stops_politely  # first: Ctrl-C during the imports below is polite too

# isort: split

import logging
import shutil
import tempfile
from pathlib import Path

from specdec.gguf.loading import load_gguf_tokenizer
from specdec.study.logs import log_to

log = logging.getLogger("gguf_tokenizer")


def main(snakemake):
    with log_to(snakemake.log[0]):
        tokenizer = load_gguf_tokenizer(snakemake.input[0])
        out = Path(snakemake.output[0])
        # written beside the output and renamed: an interrupted job leaves no half directory behind
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        log.info("%s: %d tokens, eos %r, context %d, saved to %s", snakemake.input[0], len(tokenizer),
                 tokenizer.eos_token, tokenizer.model_max_length, out)


if "snakemake" in globals():
    stops_politely(main, snakemake)  # noqa: F821
