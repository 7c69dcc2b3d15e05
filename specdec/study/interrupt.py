"""Stopping a job politely: Ctrl-C (SIGINT to the process group, as a terminal sends it) or SIGTERM ends a workflow
job within seconds with one line on stderr, not a traceback. Outputs are written atomically (io.py), so an
interrupted job leaves none, and rerunning the same Snakemake command resumes where the run stopped.

Workflow scripts import this module first: from then on an interrupt during their (slow) imports exits at once, as
nothing has been written yet; `stops_politely` runs main() with interrupts turned into KeyboardInterrupt, so that
every `finally` (the atomic writers' clean-up among them) runs before the job exits.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Callable

EXIT_INTERRUPTED = 130  # what a shell reports for a process ended by SIGINT


def _job_name() -> str:
    snakemake = getattr(sys.modules.get("__main__"), "snakemake", None)
    if snakemake is None:
        return "job"
    wildcards = ", ".join(f"{k}={v}" for k, v in dict(getattr(snakemake, "wildcards", {}) or {}).items())
    return f"{getattr(snakemake, 'rule', 'job')}{f' ({wildcards})' if wildcards else ''}"


def _say_interrupted() -> None:
    print(f"specdec: {_job_name()} interrupted, nothing written; rerun the same command to resume",
          file=sys.__stderr__, flush=True)


def _exit_now(signum, frame):
    _say_interrupted()
    os._exit(EXIT_INTERRUPTED)


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


def stops_politely(main: Callable, snakemake) -> None:
    """Run a workflow script's main(snakemake); on an interrupt print one line naming the job and exit 130."""
    signal.signal(signal.SIGINT, _raise_keyboard_interrupt)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        main(snakemake)
    except KeyboardInterrupt:
        _say_interrupted()
        sys.exit(EXIT_INTERRUPTED)


if getattr(sys.modules.get("__main__"), "snakemake", None) is not None:  # imported by a workflow script
    signal.signal(signal.SIGINT, _exit_now)
    signal.signal(signal.SIGTERM, _exit_now)
