"""Route a workflow job's logging, warnings, stdout and stderr to its Snakemake log file."""

import contextlib
import logging
import sys
from pathlib import Path

log = logging.getLogger("specdec")


@contextlib.contextmanager
def log_to(path):
    """For the duration of the block, logging (INFO and up), warnings, print() and library chatter on stderr go to
    `path`; an exception is logged with its traceback before it propagates."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", buffering=1) as stream, contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        old_level = root.level
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        logging.captureWarnings(True)
        try:
            yield
        except Exception:
            log.exception("failed")
            raise
        finally:
            logging.captureWarnings(False)
            root.removeHandler(handler)
            root.setLevel(old_level)
            sys.stdout.flush()
