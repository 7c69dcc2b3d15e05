"""Atomic file writes: a reader never sees a half-written output, and an interrupted job leaves no complete-looking file.
Also the one reader the workflow's table stages share: many outputs of one stage as one frame."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

import pandas as pd


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp makes the file private (0600); give it the permissions a plain open() would (umask applied).
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def read_table(path: str | os.PathLike) -> pd.DataFrame:
    """A parquet or CSV table (by its suffix)."""
    return pd.read_csv(path) if str(path).endswith(".csv") else pd.read_parquet(path)


def read_parquets(paths) -> pd.DataFrame:
    """The rows of every table (parquet or CSV) in `paths`, in order, as one frame."""
    return pd.concat([read_table(p) for p in paths], ignore_index=True)


def write_parquet(df: pd.DataFrame, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)


def write_csv(df: pd.DataFrame, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)


def write_text(text: str, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_figure(fig, path: str | os.PathLike) -> None:
    """Save a matplotlib figure as PNG (atomically, like every other output) and close it."""
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
