"""A GGUF file's header read alone: its metadata and its tensor table (each tensor's type, shape, and where its bytes
lie), without the tensor data and, unless asked for, without the vocabulary's strings (walked, only counted: building
them is most of what the gguf package's reader spends on the study's files).

Imports nothing of the engine, so both `gguf_model` (which copies the bytes the table points at) and `gguf_loading`
(the checks a pair of files passes before either loads) build on it.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

VOCABULARY_KEY = "tokenizer.ggml.tokens"
GGUF_VERSIONS = (2, 3)  # v1 counted in 32 bits; llama.cpp has written v3 since 2023


class GGUFFileError(ValueError):
    """A path that is not a readable GGUF file (wrong magic bytes, an unknown version, a truncated header or tensor
    data, a tensor named twice)."""


# GGUF metadata value types: fixed-size ones by struct format; 8 is a string, 9 an array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class TensorInfo(NamedTuple):
    """One entry of a GGUF file's tensor table. qtype: the ggml type's name ("Q4_K", "F32"; "ggml type N" for a type
    the gguf package does not know); shape in torch order (outermost first: a matrix is (out_features, in_features));
    offset: where its bytes start in the file (absolute: the data section's start plus the table's offset); nbytes:
    how many bytes it takes (None for an unknown type)."""

    qtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int | None

    @property
    def end(self) -> int | None:
        return None if self.nbytes is None else self.offset + self.nbytes


@dataclass(frozen=True)
class GGUFHeader:
    """A GGUF file's metadata and tensor table, read without its tensor data.

    metadata: every key, as the gguf package's `field.contents()` gives it (ints, floats, bools, strings; arrays of
    numbers as lists); string arrays are lists only for the keys asked for (the vocabulary), else their length
    (walking them is all the cost of a header); tensors: name -> TensorInfo (qtype, shape in torch order, absolute
    byte offset in the file, byte size), in the file's order; `qtype, shape, *_ = header.tensors[name]`."""

    path: str
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    kv_end: int = field(repr=False, default=0)  # where the metadata ends and the tensor table starts
    table_end: int = field(repr=False, default=0)  # where the tensor table ends
    data_start: int = field(repr=False, default=0)  # the aligned start of the tensor data
    file_size: int = field(repr=False, default=0)  # the file's length in bytes

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")


def _type_info(type_id: int) -> tuple[str, tuple[int, int] | None]:
    """A ggml type's name and (values per block, bytes per block), None for a type the gguf package does not know."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        qtype = GGMLQuantizationType(type_id)
    except ValueError:
        return f"ggml type {type_id}", None
    return qtype.name, GGML_QUANT_SIZES.get(qtype)


def read_header(path: str | os.PathLike, string_arrays: tuple[str, ...] = (VOCABULARY_KEY,)) -> GGUFHeader:
    """Parse a GGUF file's header: FileNotFoundError for a missing file, GGUFFileError for one that is not GGUF.
    string_arrays: the keys whose string arrays are kept as lists (the others: their length)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
        if magic != b"GGUF":
            raise GGUFFileError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as blob:
            try:
                return _parse(path, blob, set(string_arrays))
            except (struct.error, UnicodeDecodeError, IndexError) as e:
                raise GGUFFileError(f"{path}: the GGUF header is truncated or corrupt ({e})") from e


def _parse(path: Path, blob, string_arrays: set[str]) -> GGUFHeader:
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", blob, 4)
    if version not in GGUF_VERSIONS:
        raise GGUFFileError(f"{path} is GGUF version {version}; this reader handles versions "
                            f"{', '.join(map(str, GGUF_VERSIONS))} (little-endian)")
    pos = 24

    def string(at):
        (length,) = struct.unpack_from("<Q", blob, at)
        at += 8
        if at + length > len(blob):
            raise IndexError("a string runs past the end of the file")
        return blob[at:at + length].decode("utf-8"), at + length

    def value(at, kind, keep):
        if kind in _SCALARS:
            fmt = _SCALARS[kind]
            return struct.unpack_from(fmt, blob, at)[0], at + struct.calcsize(fmt)
        if kind == 8:
            return string(at)
        if kind != 9:
            raise IndexError(f"unknown metadata value type {kind}")
        item, count = struct.unpack_from("<IQ", blob, at)
        at += 12
        if item in _SCALARS:
            fmt = _SCALARS[item]
            return list(struct.unpack_from(f"<{count}{fmt[1]}", blob, at)), at + count * struct.calcsize(fmt)
        if item != 8:
            raise IndexError(f"metadata arrays of type {item} are not read")
        if keep:
            items = []
            for _ in range(count):
                text, at = string(at)
                items.append(text)
            return items, at
        for _ in range(count):  # skipped: only its length is kept
            at += 8 + struct.unpack_from("<Q", blob, at)[0]
        return count, at

    metadata = {}
    for _ in range(n_kv):
        key, pos = string(pos)
        if key in metadata:  # the gguf package's reader refuses it too
            raise GGUFFileError(f"{path}: metadata key {key!r} appears twice")
        (kind,) = struct.unpack_from("<I", blob, pos)
        metadata[key], pos = value(pos + 4, kind, key in string_arrays)
    kv_end = pos
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFFileError(f"{path}: general.alignment {alignment!r} is not a power of two")
    table = []
    for _ in range(n_tensors):
        name, pos = string(pos)
        (n_dims,) = struct.unpack_from("<I", blob, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", blob, pos + 4)
        type_id, offset = struct.unpack_from("<IQ", blob, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        table.append((name, dims, type_id, offset))
    data_start = (pos + alignment - 1) // alignment * alignment
    tensors = {}
    for name, dims, type_id, offset in table:
        if name in tensors:
            raise GGUFFileError(f"{path}: tensor {name!r} appears twice in the tensor table")
        qtype, block = _type_info(type_id)
        elements = 1
        for d in dims:
            elements *= int(d)
        nbytes = None if block is None else elements * block[1] // block[0]  # the gguf package's count
        shape = tuple(int(d) for d in reversed(dims))  # ggml lists innermost first
        tensors[name] = TensorInfo(qtype, shape, data_start + int(offset), nbytes)
    return GGUFHeader(str(path), version, metadata, tensors, kv_end=kv_end, table_end=pos, data_start=data_start,
                      file_size=len(blob))
