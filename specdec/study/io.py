"""Atomic file writes: a reader never sees a half-written output, and an interrupted job leaves no complete-looking
file. Also the one reader the workflow's table stages share: many outputs of one stage as one frame."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pandas as pd

from specdec.fp32.kernel_tables import tables_from_timings


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


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary sibling directory of `path`; move it into place (replacing `path`, whose old contents
    are moved aside first, then deleted) only if the block succeeds, so that a partial directory never looks
    complete."""
    out_dir = Path(path)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
        old = None
        if out_dir.exists() or out_dir.is_symlink():
            old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


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


def read_backend_tables(path) -> dict[str, dict] | None:
    """The fastest product per weight shape and row count from a kernel table (time_linear_backends: fp32
    backends; time_bf16_products: bf16 products with the prompt pass's under "beyond"); None without a path."""
    return tables_from_timings(pd.read_csv(path).to_dict("records")) if path else None
