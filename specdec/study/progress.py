"""Progress of a long job: done/total, tokens per second and an estimate of the time left.

Every update is a plain line on the `specdec.progress` logger, which a workflow job routes to its log file
(logs.log_to). Where the process's own stderr is a terminal
(a job run by hand, or Snakemake in a terminal: its jobs inherit it), a tqdm bar is drawn there too, so a long job
is never silent on screen either.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Callable

_logger = logging.getLogger("specdec.progress")


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class Progress:
    def __init__(self, total: int, what: str = "sequences", log: Callable[[str], None] = _logger.info,
                 bar: bool | None = None, clock: Callable[[], float] = time.perf_counter):
        self.total, self.what, self.log, self.clock = total, what, log, clock
        self.done, self.tokens = 0, 0
        self.started = clock()
        self._bar = None
        terminal = sys.__stderr__ is not None and sys.__stderr__.isatty()
        if bar if bar is not None else terminal:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit=what[:-1] if what.endswith("s") else what, file=sys.__stderr__,
                             dynamic_ncols=True, leave=False)

    def line(self) -> str:
        elapsed = self.clock() - self.started
        rate = f"{self.tokens / elapsed:.2f} tokens/s" if elapsed > 0 and self.tokens else "- tokens/s"
        left = (f"~{_duration(elapsed / self.done * (self.total - self.done))} left" if self.done
                else "time left unknown")
        return f"{self.done}/{self.total} {self.what}, {rate}, {_duration(elapsed)} elapsed, {left}"

    def update(self, n: int = 1, tokens: int = 0, note: str = "") -> None:
        self.done += n
        self.tokens += tokens
        self.log(f"[{self.line()}] {note}".rstrip())
        if self._bar is not None:
            self._bar.update(n)
            self._bar.set_postfix_str(note[:60], refresh=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
