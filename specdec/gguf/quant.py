"""Weights as a GGUF file holds them: quantized matrices whose rows are ggml blocks, and their products.

A `QuantMatrix` keeps one GGUF tensor's bytes as they are in the file (rows of ggml blocks: Q4_K and Q6_K 256 values
per 144 / 210 bytes, Q5_0 and Q8_0 32 values per 22 / 34 bytes; F32 and F16 plain), or, on the AVX-512 kernels, the
same blocks repacked in groups of 16 rows (`in_layout`, every byte kept), so a step reads about a sixth of the fp32
bytes. Its product with a few rows of activations runs on specdec/native/_quant.c: each activation row
is quantised on its own to 8 bits (Q8_K blocks for the K-quants, Q8_0 for Q5_0 and Q8_0, as llama.cpp does), the
blocks' dot products run in integers (exact in any order) and each output's float epilogue is summed block by block
in one order: a row's result is the same bits whatever other rows share the call and on any thread count.

Dequantisation (`dequantize_rows`, the token embedding's lookup) gives exactly the values of the `gguf` package's
reference (tests/test_quant.py compares every type bit for bit)."""

from __future__ import annotations

import contextlib
import functools
import os

import numpy as np
import torch

try:
    from specdec.native import _quant
except ImportError:  # not built (no compiler at install time)
    _quant = None

# ggml type name -> (values per block, bytes per block); the types the two study GGUF files hold, and plain floats.
BLOCKS = {"Q4_K": (256, 144), "Q6_K": (256, 210), "Q5_0": (32, 22), "Q8_0": (32, 34), "F32": (1, 4), "F16": (1, 2)}
SUPPORTED_TYPES = tuple(BLOCKS)
# The block types a matrix can be requantised to (`QuantMatrix.requantized`): those the gguf package's reference
# quantiser writes and the engine runs.
REQUANTIZE_TYPES = ("Q5_0", "Q8_0")
REQUANTIZE_CHUNK_ROWS = 8192  # rows dequantised at a time: a 65536-row head's floats would take 235 MB at once


class UnsupportedTensorType(ValueError):
    """A GGUF tensor of a type the quantized engine cannot run (refused by name before any work)."""


def available() -> bool:
    return _quant is not None and _quant.supported()


KERNEL_ENV = "SPECDEC_QUANT_KERNEL"
_kernel_override: str | None = None  # set by use_kernel
_planned_kernel: str | None = None  # set by the first model's kernel plan (specdec/gguf/kernel_plan.py)
_session_kernel: str | None = None  # set by `session_kernel` while a session runs a pass on its own plan's kernel


@functools.cache  # the CPU's instruction sets do not change: asked once, not on every product
def kernels() -> tuple[str, ...]:
    """The product kernels this CPU runs: "avx2"; where the CPU has AVX-512 BW, VL and VNNI, "avx512-vnni-256" (those
    instructions on 256-bit registers: for CPUs that split 512-bit ones in two halves) and "avx512-vnni" (512-bit);
    then "amx" where it also has AMX-TILE and AMX-INT8 and Linux grants the tile state (Q4_K passes of 3 or more rows
    on tiles). Every one gives the same bits (tests/test_quant.py), so the choice changes speed only: a model's kernel
    plan measures them (specdec/gguf/kernel_plan.py); without one the last runs."""
    return tuple(_quant.kernels()) if available() else ()


def kernel_name() -> str:
    """The product kernel the products run on now: the one `use_kernel` set, else the one $SPECDEC_QUANT_KERNEL
    names, else the one the running session's kernel plan chose for this pass (`session_kernel`), else the one the
    process's first kernel plan measured fastest here (specdec/gguf/kernel_plan.py), else the last this CPU runs;
    "unavailable" without the module."""
    runnable = kernels()
    if not runnable:
        return "unavailable"
    chosen = _kernel_override or os.environ.get(KERNEL_ENV) or _session_kernel or _planned_kernel or runnable[-1]
    if chosen not in runnable:
        raise ValueError(f"{KERNEL_ENV}={chosen!r} is not a product kernel this CPU runs; it runs "
                         f"{', '.join(runnable)}")
    return chosen


def kernel_override() -> str | None:
    """The kernel a `use_kernel` block names, if one is open."""
    return _kernel_override


def planned_kernel() -> str | None:
    """The kernel a model's plan chose in this process, if one did."""
    return _planned_kernel


def _check_runnable(name: str) -> None:
    if name not in kernels():
        raise ValueError(f"{name!r} is not a product kernel this CPU runs; it runs {', '.join(kernels()) or 'none'}")


def set_planned_kernel(name: str | None) -> None:
    """Make `name` the process's kernel where nothing names one (a kernel plan's choice; None: back to the default)."""
    global _planned_kernel
    if name is not None:
        _check_runnable(name)
    _planned_kernel = name


@contextlib.contextmanager
def session_kernel(name: str | None):
    """Run the products inside the block on kernel `name` unless `use_kernel` or $SPECDEC_QUANT_KERNEL names another
    (a session's pass on its own model's plan, specdec/gguf/lean.py; None: as outside)."""
    global _session_kernel
    if name is not None:
        _check_runnable(name)
    previous, _session_kernel = _session_kernel, name or _session_kernel
    try:
        yield
    finally:
        _session_kernel = previous


@contextlib.contextmanager
def use_kernel(name: str):
    """Run the products inside the block on kernel `name` (tests and benchmarks compare the kernels this way)."""
    global _kernel_override
    _check_runnable(name)
    previous, _kernel_override = _kernel_override, name
    try:
        yield name
    finally:
        _kernel_override = previous


# Layouts of a matrix's bytes: "rows", the file's rows of blocks; "r16", the blocks of Q4_K, Q6_K, Q5_0 or Q8_0
# repacked in groups of 16 rows for the AVX-512 kernels (specdec/native/_quant_kernels.h, q4k_pack_block ..
# q8_0_pack_block: every byte kept; Q4_K 148 bytes a row and block instead of 144, the others as in the file; the same
# products, bit for bit, with a fraction of the instructions per block).
LAYOUTS = ("rows", "r16")
R16_ROWS = 16
R16_BLOCK_BYTES = {"Q4_K": 148, "Q6_K": 210, "Q5_0": 22, "Q8_0": 34}
LAYOUT_ENV = "SPECDEC_QUANT_LAYOUT"


# The grouped types the avx2 kernel loads in groups by default: Q4_K (AMD EPYC Zen 3, 2 threads, the 1.5B's ffn_up
# and attn_q: 0.42-0.58 of the rows' time at 1-5 rows; sixteenth run), Q5_0 (the 0.5B's layers: 0.44-0.56 at one
# row, 0.62-0.73 at three) and Q8_0 (the 0.5B's head: 0.85-0.91 at one row, 0.77 at three; seventeenth run); Q6_K's
# groups there took 1.1-1.2x the rows' (experiments/cpu-lead, sixteenth run), so the kernel plan decides them by
# measuring. The AVX-512 kernels group every type that has them.
AVX2_GROUPED = frozenset({"Q4_K", "Q5_0", "Q8_0"})


def default_layout(qtype: str, kernel: str) -> str:
    """The layout a matrix of this type takes on `kernel` unless a kernel plan says otherwise: "r16" for every
    grouped type on the AVX-512 kernels (measured faster there: docs/quantized.md; amx runs Q4_K passes of 48 or
    more rows of that layout on its tiles) and for AVX2_GROUPED on avx2, else "rows"."""
    if qtype not in R16_BLOCK_BYTES:
        return "rows"
    return "r16" if kernel != "avx2" or qtype in AVX2_GROUPED else "rows"


def can_group(qtype: str, out_features: int) -> bool:
    """Whether a matrix of this type and height may load in groups of 16 rows: a grouped type (every kernel
    multiplies each of them with its group functions), whole groups, and $SPECDEC_QUANT_LAYOUT not "rows"."""
    wanted = os.environ.get(LAYOUT_ENV, "auto")
    if wanted not in ("auto", "rows"):
        raise ValueError(f"{LAYOUT_ENV}={wanted!r}: expected 'auto' or 'rows'")
    return wanted == "auto" and qtype in R16_BLOCK_BYTES and out_features % R16_ROWS == 0 and available()


def preferred_layout(qtype: str, out_features: int) -> str:
    """The layout a matrix of this type and height is given when a model loads: `default_layout` on this process's
    kernel where it `can_group`, else "rows"; $SPECDEC_QUANT_LAYOUT=rows keeps every matrix in the file's rows.
    Either layout gives the same bits."""
    return default_layout(qtype, kernel_name()) if can_group(qtype, out_features) else "rows"


def kernel_label(grouped: bool | None = None) -> str:
    """The product kernel and, for matrices in groups of 16 rows, that layout ("avx512-vnni-r16"): what steps and
    provenance record. grouped: whether they are (None: whether models load Q4_K that way now)."""
    if grouped is None:
        grouped = preferred_layout("Q4_K", R16_ROWS) == "r16"
    return f"{kernel_name()}-r16" if grouped else kernel_name()


def weight_bytes(rows: int, columns: int) -> torch.Tensor:
    """An uninitialised (rows, columns) uint8 tensor for a matrix's bytes, in memory that Linux backs with 2 MB pages
    where it can: numpy asks for them (madvise MADV_HUGEPAGE) on every allocation of 4 MB or more, torch does not. A
    step streams every byte of the weights once, and on 4 KB pages each page is a TLB miss: the 1.5B file's Q6_K
    head read in 9.1 ms on 2 MB pages against 13.3 on 4 KB ones (Intel Xeon, one process, interleaved). The pages
    change no value."""
    return torch.from_numpy(np.empty((rows, columns), dtype=np.uint8))


def row_bytes(qtype: str, in_features: int, layout: str = "rows") -> int:
    values, nbytes = BLOCKS[qtype]
    if layout == "r16":
        nbytes = R16_BLOCK_BYTES[qtype]
    if in_features % values:
        raise ValueError(f"a {qtype} row holds a multiple of {values} values, got {in_features}")
    return in_features // values * nbytes


def _gguf_type(qtype: str):
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[qtype]


def reference_dequantize(raw: np.ndarray, qtype: str) -> np.ndarray:
    """The `gguf` package's own dequantisation of raw rows (the reference our kernels must reproduce bit for bit)."""
    from gguf.quants import dequantize

    return dequantize(np.ascontiguousarray(raw), _gguf_type(qtype)).astype(np.float32, copy=False)


class QuantMatrix:
    """One GGUF weight matrix (out_features x in_features) in its file's block format.

    raw: uint8 (out_features, row_bytes): the file's rows of blocks (layout "rows"), or (Q4_K, Q6_K, Q5_0, Q8_0) the
    same blocks repacked in groups of 16 rows (layout "r16", `in_layout`); a copy in memory, never written to. name: the
    tensor's name in the file, for errors."""

    def __init__(self, raw: torch.Tensor, qtype: str, in_features: int, name: str = "weight", layout: str = "rows"):
        if qtype not in BLOCKS:
            raise UnsupportedTensorType(f"tensor {name!r} has type {qtype}; the quantized engine runs "
                                        f"{', '.join(SUPPORTED_TYPES)}")
        if layout not in LAYOUTS or (layout == "r16" and qtype not in R16_BLOCK_BYTES):
            raise ValueError(f"tensor {name!r}: layout {layout!r} is not one of {qtype}'s (rows; r16 for "
                             f"{', '.join(R16_BLOCK_BYTES)} only)")
        if not isinstance(raw, torch.Tensor) or raw.dtype != torch.uint8 or raw.dim() != 2:
            raise TypeError(f"tensor {name!r}: raw bytes must be a 2-d uint8 tensor, got "
                            f"{getattr(raw, 'dtype', type(raw).__name__)} {tuple(getattr(raw, 'shape', ()))}")
        if raw.shape[1] != row_bytes(qtype, in_features, layout):
            raise ValueError(f"tensor {name!r}: {raw.shape[1]} bytes per row, but {in_features} {qtype} values take "
                             f"{row_bytes(qtype, in_features, layout)} in layout {layout}")
        if layout == "r16" and raw.shape[0] % R16_ROWS:
            raise ValueError(f"tensor {name!r}: layout r16 holds whole groups of {R16_ROWS} rows, got {raw.shape[0]}")
        self.raw = raw.contiguous()
        self.qtype, self.name, self.layout = qtype, name, layout
        self.out_features, self.in_features = raw.shape[0], in_features

    @property
    def kernel_type(self) -> str:
        """The type name the native code takes for these bytes ("Q4_K_R16" for Q4_K in groups of 16 rows)."""
        return f"{self.qtype}_R16" if self.layout == "r16" else self.qtype

    def in_layout(self, layout: str) -> QuantMatrix:
        """This matrix with its bytes in `layout` (a new copy; itself where it is already in it). Every byte of the
        file's blocks is kept: the "rows" of an "r16" matrix are the file's bytes again."""
        if layout == self.layout:
            return self
        if layout not in LAYOUTS or self.qtype not in R16_BLOCK_BYTES:
            raise ValueError(f"tensor {self.name!r}: {self.qtype} has no layout {layout!r}")
        if self.out_features % R16_ROWS:
            raise ValueError(f"tensor {self.name!r}: layout r16 holds whole groups of {R16_ROWS} rows, got "
                             f"{self.out_features}")
        if not available():
            raise RuntimeError("repacking needs specdec.native._quant on an x86 CPU with AVX2, FMA and F16C")
        out = weight_bytes(self.out_features, row_bytes(self.qtype, self.in_features, layout))
        convert = _quant.r16_pack if layout == "r16" else _quant.r16_unpack
        convert(self.qtype, self.raw.data_ptr(), out.data_ptr(), self.out_features, self.in_features)
        return QuantMatrix(out, self.qtype, self.in_features, self.name, layout)

    @property
    def rows_per_group(self) -> int:
        """The rows its layout keeps together (16 in r16, 1 in rows): a slice of rows holds whole groups of them."""
        return R16_ROWS if self.layout == "r16" else 1

    def first_rows(self, rows: int) -> QuantMatrix:
        """The matrix of this one's first `rows` rows (a whole number of `rows_per_group`), sharing its bytes: a head
        that computes the logits of the first token ids only."""
        whole = self.rows_per_group
        if not isinstance(rows, int) or not 0 < rows <= self.out_features or rows % whole:
            raise ValueError(f"tensor {self.name!r}: first_rows takes 1..{self.out_features} rows"
                             f"{f' in whole groups of {whole}' if whole > 1 else ''}, got {rows!r}")
        return QuantMatrix(self.raw[:rows], self.qtype, self.in_features, self.name, self.layout)

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    @property
    def nbytes(self) -> int:
        return self.raw.numel()

    def dequantize_rows(self, rows: torch.Tensor | list[int] | None = None) -> torch.Tensor:
        """fp32 values of the given rows (all rows when None): the `gguf` package's values, bit for bit."""
        index = torch.arange(self.out_features) if rows is None else torch.as_tensor(rows, dtype=torch.long).reshape(-1)
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= self.out_features):
            raise IndexError(f"tensor {self.name!r}: rows must lie in [0, {self.out_features}), got "
                             f"{int(index.min())}..{int(index.max())}")
        if self.layout == "r16":  # the groups that hold the rows, back in the file's rows
            groups = torch.unique(index // R16_ROWS)
            raw = self.raw.view(-1, R16_ROWS, self.raw.shape[1])[groups].reshape(-1, self.raw.shape[1])
            rows_of = QuantMatrix(raw, self.qtype, self.in_features, self.name, "r16").in_layout("rows")
            position = torch.searchsorted(groups, index // R16_ROWS) * R16_ROWS + index % R16_ROWS
            return rows_of.dequantize_rows(position)
        picked = self.raw.index_select(0, index)
        if available():
            out = torch.empty(index.numel(), self.in_features, dtype=torch.float32)
            if index.numel():
                _quant.dequantize(self.qtype, picked.data_ptr(), out.data_ptr(), index.numel(), self.in_features)
            return out
        return torch.from_numpy(reference_dequantize(picked.numpy(), self.qtype).reshape(index.numel(), -1).copy())

    def requantized(self, qtype: str) -> QuantMatrix:
        """This matrix's values in another block type (one of REQUANTIZE_TYPES), in its own layout: dequantised and
        quantised again by the gguf package's reference code, a chunk of rows at a time. The values change (a second
        rounding), so only a draft's weights go through it, never a target's: exactness does not depend on a draft.
        Q5_0 holds 32 values in 22 bytes against Q8_0's 34: a Q8_0 head in Q5_0 reads 35% fewer bytes. Itself where
        it is already of that type."""
        if qtype not in REQUANTIZE_TYPES:
            raise ValueError(f"tensor {self.name!r}: requantising writes {', '.join(REQUANTIZE_TYPES)} only, "
                             f"got {qtype!r}")
        if qtype == self.qtype:
            return self
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize

        source = self.in_layout("rows")
        out = weight_bytes(self.out_features, row_bytes(qtype, self.in_features))
        for start in range(0, self.out_features, REQUANTIZE_CHUNK_ROWS):
            rows = list(range(start, min(start + REQUANTIZE_CHUNK_ROWS, self.out_features)))
            values = source.dequantize_rows(rows).numpy()
            out[start:start + len(rows)] = torch.from_numpy(quantize(values, GGMLQuantizationType[qtype]))
        return QuantMatrix(out, qtype, self.in_features, self.name).in_layout(
            self.layout if qtype in R16_BLOCK_BYTES else "rows")

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x (rows, in_features) @ Wᵀ (+ bias) -> fp32 (rows, out_features), batch-invariant (module docstring)."""
        if not available():
            raise RuntimeError("the quantized product needs specdec.native._quant (built by the install where a C "
                               "compiler is there) on an x86 CPU with AVX2, FMA and F16C")
        check_quant_product(x, self, bias)
        x = x.float().contiguous()
        y = torch.empty(x.shape[0], self.out_features, dtype=torch.float32)
        if x.shape[0]:
            b = None if bias is None else bias.float().contiguous()
            _quant.matmul(self.kernel_type, self.raw.data_ptr(), self.raw.shape[1], x.data_ptr(),
                          0 if b is None else b.data_ptr(), y.data_ptr(), self.out_features, self.in_features,
                          x.shape[0], torch.get_num_threads(), kernel_name())
        return y


def quantize_q8_0(weight: torch.Tensor, name: str = "weight") -> QuantMatrix:
    """A float matrix (out_features, in_features: a multiple of 32) as Q8_0 blocks, quantised by the `gguf` package
    (ggml's own rounding: per 32 values one fp16 scale and 32 int8), in the layout the product kernel runs fastest
    (`preferred_layout`): weights of our own (a trained draft head) on the engine's quantized product."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"{name}: Q8_0 quantises a floating-point matrix, got "
                         f"{getattr(weight, 'dtype', type(weight).__name__)} {tuple(getattr(weight, 'shape', ()))}")
    out_features, in_features = weight.shape
    if in_features % BLOCKS["Q8_0"][0]:
        raise ValueError(f"{name}: Q8_0 rows hold a multiple of 32 values, got {in_features}")
    from gguf.quants import quantize

    raw = quantize(weight.detach().float().cpu().numpy(), _gguf_type("Q8_0"))
    matrix = QuantMatrix(torch.from_numpy(raw.reshape(out_features, -1)), "Q8_0", in_features, name)
    return matrix.in_layout(preferred_layout("Q8_0", out_features)) if available() else matrix


def check_quant_product(x: torch.Tensor, weight: QuantMatrix, bias: torch.Tensor | None) -> None:
    """What specdec/native/_quant.c relies on, checked before the call (errors name the tensor)."""
    name = weight.name
    for what, tensor in (("input", x), ("bias", bias)):
        if tensor is not None and (not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu"):
            raise ValueError(f"{name}: the {what} must be a CPU tensor, got "
                             f"{getattr(tensor, 'device', type(tensor).__name__)}")
    if weight.raw.device.type != "cpu" or not weight.raw.is_contiguous():
        raise ValueError(f"{name}: the weight's bytes must be a contiguous CPU tensor")
    if not x.is_floating_point() or x.dim() != 2 or x.shape[1] != weight.in_features:
        raise ValueError(f"{name}: the input must be a floating-point (rows, {weight.in_features}) tensor, got "
                         f"{x.dtype} {tuple(x.shape)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.out_features or not bias.is_floating_point()):
        raise ValueError(f"{name}: the bias must be a floating-point vector of {weight.out_features} values, got "
                         f"{bias.dtype} {tuple(bias.shape)}")


def random_quant_matrix(qtype: str, out_features: int, in_features: int, seed: int = 0,
                        name: str = "weight") -> QuantMatrix:
    """A matrix of random valid blocks of `qtype` (tests and tiny models): random quants, random 6-bit or 8-bit
    sub-scales, and block scales drawn as small fp16 values (never inf or NaN)."""
    rng = np.random.default_rng(seed)
    values, nbytes = BLOCKS[qtype]
    blocks = out_features * in_features // values
    if qtype in ("F32", "F16"):
        dtype = np.float32 if qtype == "F32" else np.float16
        data = (rng.standard_normal((out_features, in_features)) * 0.5).astype(dtype)
        return QuantMatrix(torch.from_numpy(data.view(np.uint8).copy()), qtype, in_features, name)
    raw = rng.integers(0, 256, size=(blocks, nbytes), dtype=np.uint8)
    # block scales sized so that values stay within about +-2 (the sub-scales and quants are random up to their range)
    top = {"Q4_K": 0.002, "Q6_K": 5e-4, "Q5_0": 0.12, "Q8_0": 0.015}[qtype]
    scale = lambda: rng.uniform(top / 10, top, size=(blocks, 1)).astype(np.float16).view(np.uint8)  # noqa: E731
    if qtype == "Q4_K":  # d, dmin at bytes 0-3
        raw[:, 0:2], raw[:, 2:4] = scale(), scale()
    elif qtype == "Q6_K":  # d at the end
        raw[:, 208:210] = scale()
    else:  # Q5_0, Q8_0: d first
        raw[:, 0:2] = scale()
    return QuantMatrix(torch.from_numpy(raw.reshape(out_features, -1)), qtype, in_features, name)
