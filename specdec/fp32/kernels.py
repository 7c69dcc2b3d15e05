"""CPU fast paths for batch-1 decoding that keep the model's weights (same values, same dtype, no copy).

A decoding step multiplies every weight by one row, a verify pass by k + 1 rows. Which backend reads the weights
fastest depends on the CPU and on the row count (docs/performance.md): on this project's AMD machines torch's fp32
`F.linear` (MKL) reaches most of the bandwidth for one row and a third of it for 2-9, while on an Intel machine with
AMX it is at the floor for one row. So a linear layer carries a table, row count -> backend, and the table can be
measured on the machine itself (`time_backends` + `fastest_backends`: `runtime.linear_kernel: auto`).

fp32 backends: "linear" (torch's F.linear), "weight_major" (W @ xᵀ, the weight as the left operand), "avx2"
(specdec/native/_linear.c: every weight read once for 1-16 rows; built by the install where a C compiler is there, used
only on CPUs with AVX2 and FMA). A bf16 layer (a draft held in bf16) uses RowAdaptiveBf16Linear instead, on torch's
bf16 product, the same C kernel reading bf16 weights ("avx2-bf16") or an fp32 copy of the same values, per shape and
row count whichever `tune_row_adaptive_bf16` measures fastest when the model loads.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Mapping

import torch
from torch import nn

from specdec.native import build as native_build
from specdec.native.attention import INVARIANT_ROWS
from specdec.fp32.kernel_tables import (
    BF16_BACKENDS,
    BF16_CHOICES,
    bf16_tables,
)

try:
    from specdec.native import _linear
except ImportError:  # not built (no compiler at install time): the torch backends remain
    _linear = None

MAX_TABLE_ROWS = 16  # row counts a timed table covers; products of more rows (prompt passes) use weight_major


def _linear_backend(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, layer: str = "") -> torch.Tensor:
    return nn.functional.linear(x, w, b)


def _weight_major(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, layer: str = "") -> torch.Tensor:
    return (torch.mm(w, x.t()) if b is None else torch.addmm(b.unsqueeze(1), w, x.t())).t()


def check_native_product(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, weight_dtype: torch.dtype,
                         layer: str = "linear layer") -> None:
    """Everything specdec/native/_linear.c relies on, checked before its raw addresses are formed: the weight's dtype
    (the kernel reads its bytes as `weight_dtype`), device, shape and contiguity; the input's width; the bias's length.
    A wrong call is a clear error naming the layer, never a read past a buffer or silent garbage."""
    for name, tensor in (("weight", w), ("input", x), ("bias", b)):
        if tensor is not None and not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{layer}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor is not None and tensor.device.type != "cpu":
            raise ValueError(f"{layer}: {name} is on {tensor.device}; the native product runs on the CPU")
    if w.dtype != weight_dtype:
        raise TypeError(f"{layer}: the native product reads a {weight_dtype} weight, got {w.dtype}")
    if w.dim() != 2 or w.shape[0] < 1 or w.shape[1] < 1:
        raise ValueError(f"{layer}: the weight must be a non-empty 2-d tensor (out, in), got {tuple(w.shape)}")
    if not w.is_contiguous():
        raise ValueError(f"{layer}: the weight must be contiguous (row-major), got strides {w.stride()} for shape "
                         f"{tuple(w.shape)}")
    if not x.is_floating_point() or x.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"{layer}: the input must be a floating-point (rows, {w.shape[1]}) tensor for a "
                         f"{tuple(w.shape)} weight, got {x.dtype} {tuple(x.shape)}")
    if b is not None and (b.dim() != 1 or b.shape[0] != w.shape[0] or not b.is_floating_point()):
        raise ValueError(f"{layer}: the bias must be a floating-point vector of {w.shape[0]} values, got {b.dtype} "
                         f"{tuple(b.shape)}")


def _c_product(kernel: Callable, weight_dtype: torch.dtype, x: torch.Tensor, w: torch.Tensor,
               b: torch.Tensor | None, layer: str) -> torch.Tensor:
    """x @ wᵀ (+ b) on a specdec.native._linear kernel, every argument checked first; x and b as contiguous fp32 (no-ops
    when they are), fp32 result."""
    check_native_product(x, w, b, weight_dtype, layer)
    y = torch.empty(x.shape[0], w.shape[0], dtype=torch.float32)
    if x.shape[0] == 0:
        return y
    x = x.float().contiguous()
    b = None if b is None else b.float().contiguous()
    kernel(w.data_ptr(), x.data_ptr(), 0 if b is None else b.data_ptr(), y.data_ptr(), w.shape[0], w.shape[1],
           x.shape[0], torch.get_num_threads())
    return y


def _avx2(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, layer: str = "linear layer") -> torch.Tensor:
    if _linear is None:
        raise RuntimeError("the avx2 product needs specdec.native._linear, which was not built here")
    return _c_product(_linear.linear, torch.float32, x, w, b, layer)


def _avx2_bf16(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
               layer: str = "linear layer") -> torch.Tensor:
    """x (any float dtype) times a bf16 weight, fp32 accumulation, fp32 result."""
    if _linear is None:
        raise RuntimeError("the avx2-bf16 product needs specdec.native._linear, which was not built here")
    return _c_product(_linear.linear_bf16, torch.bfloat16, x, w, b, layer)


kernel_build = native_build.kernel_build  # the workflow asks native_build itself (no torch at its start-up)
stale_native_modules = native_build.stale_native_modules


BACKENDS: dict[str, Callable] = {"linear": _linear_backend, "weight_major": _weight_major, "avx2": _avx2}


def available_backends() -> list[str]:
    """The fp32 backends this machine can run."""
    names = ["linear", "weight_major"]
    if _linear is not None and _linear.supported():
        names.append("avx2")
    return names


class BackendLinear(nn.Module):
    """An fp32 nn.Linear whose product runs on table[rows] (default: `backend`); beyond `max_rows` rows (a prompt
    pass; default MAX_TABLE_ROWS) on weight_major, unless plain F.linear was asked for. Shares the original
    Parameters: no copy. `name` (the layer's path in its model) names it in errors."""

    def __init__(self, linear: nn.Linear, backend: str = "linear", table: Mapping[int, str] | None = None,
                 max_rows: int = MAX_TABLE_ROWS, name: str = "linear layer"):
        super().__init__()
        self.name = name
        unknown = {backend, *(table or {}).values()} - set(BACKENDS)
        if unknown:
            raise ValueError(f"unknown linear backend(s) {sorted(unknown)}; known: {sorted(BACKENDS)}")
        if "avx2" in {backend, *(table or {}).values()} and "avx2" not in available_backends():
            raise RuntimeError("the avx2 linear backend is not available here (specdec.native._linear not built, "
                               "or a CPU without AVX2 and FMA)")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        # Row counts the table leaves out take the choice of the nearest one below it (or `backend`).
        self.table, choice = {}, backend
        for rows in range(1, max_rows + 1):
            choice = self.table[rows] = (table or {}).get(rows, choice)
        # Products of more rows (a prompt pass) are compute-bound: W @ xᵀ runs them at 1.1-1.8x F.linear's speed on
        # this project's AMD machines (docs/performance.md); plain F.linear stays where it was asked for.
        self.beyond = "linear" if backend == "linear" and not table else "weight_major"

    def backend_for(self, rows: int) -> str:
        return self.table.get(rows, self.beyond)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        name = self.backend_for(rows) if x.dtype == torch.float32 else "linear"
        out = BACKENDS[name](x.reshape(rows, self.in_features), self.weight, self.bias, layer=self.name)
        return out.reshape(*x.shape[:-1], self.out_features)


class WeightMajorLinear(BackendLinear):
    """nn.Linear computed as (W @ xᵀ)ᵀ for every row count."""

    def __init__(self, linear: nn.Linear, name: str = "linear layer"):
        super().__init__(linear, "weight_major", name=name)


# Products of a bf16 weight: torch's own bf16 product; the AVX2 kernel reading the bf16 weights.
BF16_PRODUCTS: dict[str, Callable] = {"bf16": _linear_backend, "avx2-bf16": _avx2_bf16}
assert tuple(BF16_PRODUCTS) == BF16_BACKENDS  # kernel_tables names them for the torch-free table readers
# Rows up to which each bf16 product beats the fp32 copy on the AMD machines (bench/bf16_draft_step.py --positions,
# docs/performance.md, "A bf16 draft"): torch's emulated bf16 product falls behind past ~8 rows; the AVX2 kernel
# (every bf16 weight read once per 16 rows) stays ahead to 24-40 rows (a hybrid's catch-up), behind from ~48.
BF16_MAX_ROWS = {"bf16": 8, "avx2-bf16": 32}


def available_bf16_backends() -> list[str]:
    """The bf16 backends this machine can run."""
    return list(BF16_BACKENDS) if "avx2" in available_backends() else ["bf16"]


class RowAdaptiveBf16Linear(nn.Module):
    """A bf16 linear layer whose product runs, by row count, on torch's bf16 product, the AVX2 kernel reading the
    bf16 weights, or an fp32 copy of the same values.

    Which is fastest depends on the machine and on the rows. On a CPU without native bf16 arithmetic (this project's
    AMD machines) torch's bf16 product of one row reads half the fp32 bytes but many rows are emulated and slow (a
    bf16 draft's prompt pass took 2.7x its fp32 time), while the AVX2 kernel ("avx2-bf16", specdec/native/_linear.c
    widens each weight to fp32 in registers) runs one row at 1.2-1.3x the bandwidth floor; on an Intel Xeon with AMX
    torch's bf16 product costs the same for 1 and 32 rows. `tune_row_adaptive_bf16` measures the three on the machine
    and sets a table per row count (set_table). Without one: `backend` up to `max_bf16_rows` (default: the backend's
    BF16_MAX_ROWS), the fp32 copy (`weight.float()`: exactly the same values, the result rounded back to bf16)
    beyond. Either way the layer is the bf16 model; only the accumulation differs, which no exactness argument relies
    on (a draft's q is whatever it computed)."""

    def __init__(self, linear: nn.Linear, max_bf16_rows: int | None = None, backend: str = "bf16",
                 table: Mapping[int, str] | None = None, beyond: str = "bf16-as-fp32", name: str = "linear layer"):
        super().__init__()
        self.name = name
        if linear.weight.dtype != torch.bfloat16:
            raise TypeError(f"RowAdaptiveBf16Linear wraps a bfloat16 nn.Linear, got {linear.weight.dtype}")
        if backend not in BF16_BACKENDS:
            raise ValueError(f"unknown bf16 backend {backend!r}; known: {BF16_BACKENDS}")
        unknown = {*(table or {}).values(), beyond} - set(BF16_CHOICES)
        if unknown:
            raise ValueError(f"unknown bf16 product(s) {sorted(unknown)}; known: {BF16_CHOICES}")
        if "avx2-bf16" in {backend, *(table or {}).values(), beyond} and "avx2-bf16" not in available_bf16_backends():
            raise RuntimeError("the avx2-bf16 backend is not available here (specdec.native._linear not built, "
                               "or a CPU without AVX2 and FMA)")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.max_bf16_rows = BF16_MAX_ROWS[backend] if max_bf16_rows is None else max_bf16_rows
        self.backend = backend
        self.set_table(table, beyond)
        self.weight, self.bias = linear.weight, linear.bias
        # Not Parameters: kept out of state_dict and of parameter counts; 2x the bf16 weight's memory.
        self.weight_fp32 = linear.weight.detach().float()
        self.bias_fp32 = None if linear.bias is None else linear.bias.detach().float()

    def set_table(self, table: Mapping[int, str] | None, beyond: str = "bf16-as-fp32") -> None:
        """Measured choices (`tune_row_adaptive_bf16`): row count -> product for the timed row counts, which the
        counts between them share with the timed count below; `beyond` for more rows than the largest timed count.
        Without a table: `backend` up to max_bf16_rows, the fp32 copy beyond."""
        self.table = dict(sorted((int(rows), name) for rows, name in (table or {}).items()))
        self.beyond = beyond

    def backend_for(self, rows: int) -> str:
        if not self.table:
            return self.backend if rows <= self.max_bf16_rows else self.beyond
        if rows > max(self.table):
            return self.beyond
        below = [timed for timed in self.table if timed <= rows]
        return self.table[below[-1] if below else min(self.table)]

    def product(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """x (rows x in_features) times the weight on the product `name` (BF16_CHOICES); fp32 or bf16 result."""
        if name == "bf16-as-fp32":
            return _weight_major(x.float(), self.weight_fp32, self.bias_fp32)
        if name == "avx2-bf16":
            return _avx2_bf16(x, self.weight, self.bias_fp32, layer=self.name)
        return nn.functional.linear(x, self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        out = self.product(self.backend_for(rows), x.reshape(rows, self.in_features))
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def invariant_kernels_available() -> bool:
    """Whether this machine can run the batch-invariant setup: the native linear and attention kernels."""
    from specdec.native import attention

    return "avx2" in available_backends() and attention.available()


def use_invariant_kernels(model: nn.Module, bf16_tables: Mapping[str, Mapping] | None = None) -> nn.Module:
    """Make a position's logits the same bits in a one-token step and in a pass over up to INVARIANT_ROWS positions,
    on any thread count (in place; returns the model): every fp32 product of up to INVARIANT_ROWS rows on the avx2
    kernel, every bf16 one on avx2-bf16 (the same order on the bf16 values), attention on the native kernel
    (specdec/native/attention.py). Prompt passes run on the fastest products (bf16: `bf16_tables`' "beyond" where
    given); their rows are never compared with a step's, since the baseline and the speculative loop share them."""
    from specdec.native import attention

    if not invariant_kernels_available():
        raise RuntimeError("linear_kernel 'invariant' needs specdec's native kernels (specdec.native._linear and "
                           "specdec.native._attention, built by the install where a C compiler is there) on an x86 CPU "
                           "with AVX2 and FMA; they are missing here. Reinstall with a compiler, or set "
                           "runtime.linear_kernel: auto (fastest per row count, not batch-invariant: greedy identity "
                           "then rests on the near-tie diagnosis)")
    use_row_adaptive_bf16_linear(model, max_bf16_rows=INVARIANT_ROWS, default="avx2-bf16")
    if bf16_tables:
        apply_bf16_tables(model, bf16_tables, per_row_count=False)
    use_backends(model, "avx2", max_rows=INVARIANT_ROWS)
    return attention.use_invariant_attention(model)


def _replace_linears(model: nn.Module, make: Callable[[nn.Linear, str], nn.Module | None]) -> nn.Module:
    """Replace every plain nn.Linear for which make(linear, its path in the model) returns a module; the original
    is kept for default_linear."""
    for path, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and (replacement := make(child, f"{path}.{name}" if path else name)):
                replacement.original = [child]  # in a list: not registered as a submodule
                setattr(parent, name, replacement)
    return model


def use_row_adaptive_bf16_linear(model: nn.Module, max_bf16_rows: int | None = None,
                                 backends: Mapping[str, str] | None = None, default: str = "bf16") -> nn.Module:
    """Replace every bfloat16 nn.Linear of `model` in place (see RowAdaptiveBf16Linear), each on its shape's backend
    from `backends` ("out x in" -> "bf16" or "avx2-bf16"), else on `default`; `tune_row_adaptive_bf16` then sets
    measured choices per row count."""
    return _replace_linears(model, lambda linear, name: RowAdaptiveBf16Linear(
        linear, max_bf16_rows, (backends or {}).get(shape_key(linear), default), name=name)
        if linear.weight.dtype == torch.bfloat16 else None)


def use_weight_major_linear(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of `model` in place by a WeightMajorLinear; returns the model."""
    return _replace_linears(model, lambda linear, name: WeightMajorLinear(linear, name))


def shape_key(linear: nn.Module) -> str:
    return f"{linear.out_features}x{linear.in_features}"


def use_backends(model: nn.Module, backend: str = "linear",
                 tables: Mapping[str, Mapping[int, str]] | None = None, max_rows: int = MAX_TABLE_ROWS) -> nn.Module:
    """Replace every fp32 nn.Linear by a BackendLinear: its shape's table (from `fastest_backends`, keyed by
    "out x in") where there is one, else `backend` for every row count up to `max_rows`; returns the model."""
    return _replace_linears(model, lambda linear, name: BackendLinear(
        linear, backend, (tables or {}).get(shape_key(linear)), max_rows, name)
        if linear.weight.dtype == torch.float32 else None)


def linear_backends(model: nn.Module, rows: int) -> str:
    """The backends the model's linear layers use for a product of `rows` rows, e.g. "avx2" or "avx2+linear"."""
    used = {m.backend_for(rows) for m in model.modules() if hasattr(m, "backend_for")}
    return "+".join(sorted(used)) or "linear"


def restore_linears(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """Put torch's own nn.Linear layers back in place of the replaced ones; returns (parent, name, replacement)."""
    swapped = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, (BackendLinear, RowAdaptiveBf16Linear)) and hasattr(child, "original"):
                setattr(parent, name, child.original[0])
                swapped.append((parent, name, child))
    return swapped


@contextmanager
def default_linear(model: nn.Module):
    """Inside the block the model runs torch's own nn.Linear again (e.g. to time a library that uses it as shipped);
    the replaced layers come back afterwards. Weights are shared throughout: nothing is copied."""
    swapped = restore_linears(model)
    try:
        yield model
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)


# --- measuring the backends on this machine ----------------------------------------------------------------------
def _layers_by_shape(model: nn.Module, dtype: torch.dtype) -> dict[str, list[nn.Module]]:
    """The model's linear layers (plain or replaced) with weights of `dtype`, grouped by "out x in" shape."""
    by_shape: dict[str, list[nn.Module]] = {}
    for module in model.modules():
        if isinstance(module, (nn.Linear, BackendLinear, RowAdaptiveBf16Linear)) and module.weight.dtype == dtype:
            by_shape.setdefault(shape_key(module), []).append(module)
    return by_shape


@torch.inference_mode()
def time_backends(model: nn.Module, rows: Iterable[int] = range(1, 10), repeats: int = 3,
                  backends: Iterable[str] | None = None, log: Callable[[str], None] = lambda _: None,
                  dtype: torch.dtype = torch.float32) -> list[dict]:
    """Seconds per product, by weight shape, row count and backend, on the model's own weights of `dtype`: fp32
    (BACKENDS; default: every one this machine has) or bf16 (BF16_PRODUCTS; default: every available one).
    One row per (shape, rows, backend): the median seconds of one product and the bytes read (`_time_products`)."""
    products = BACKENDS if dtype == torch.float32 else BF16_PRODUCTS
    backends = list(backends or (available_backends() if dtype == torch.float32 else available_bf16_backends()))
    return _time_products(_layers_by_shape(model, dtype), rows, repeats, backends,
                          lambda name, layer, x: products[name](x, layer.weight, layer.bias), dtype, log)


def _time_products(groups: Mapping[str, list[nn.Module]], rows: Iterable[int], repeats: int, names: list[str],
                   run: Callable[[str, nn.Module, torch.Tensor], torch.Tensor], dtype: torch.dtype,
                   log: Callable[[str], None]) -> list[dict]:
    """Every weight of a shape is used in turn (a layer's weights are long out of cache when its turn comes back, as
    in a decoding step), and the products are interleaved within each repeat, so that a slow moment of a shared
    machine hits all of them."""
    results = []
    for key, layers in groups.items():
        in_features = layers[0].in_features
        for m in rows:
            x = torch.randn(m, in_features).to(dtype)
            seconds = {name: [] for name in names}
            for name in names:  # first calls pick kernels and allocate: not timed
                run(name, layers[0], x)
            for repeat in range(repeats):
                for name in names[repeat % len(names):] + names[:repeat % len(names)]:
                    for layer in layers:
                        start = time.perf_counter()
                        run(name, layer, x)
                        seconds[name].append(time.perf_counter() - start)
            nbytes = layers[0].weight.numel() * layers[0].weight.element_size()
            for name, times in seconds.items():
                results.append({"shape": key, "layers": len(layers), "rows": m, "backend": name,
                                "seconds": statistics.median(times), "bytes": nbytes})
            log(f"{key} x{len(layers)} rows {m}: " + ", ".join(
                f"{r['backend']} {r['seconds'] * 1e3:.2f} ms" for r in results[-len(names):]))
    return results


# Row counts a bf16 layer's products are timed at when it loads: draft steps (1-2), verify-sized catch-ups (4-8),
# a hybrid's catch-ups over tokens lookup drafted (16-32). More rows (a prompt pass) take the faster of the two
# products that scale with rows (torch's bf16, the fp32 copy) at the largest count: the AVX2 kernel reads every
# weight once per 16 rows and falls behind both there.
BF16_TUNED_ROWS = (1, 2, 4, 8, 16, 32)


@torch.inference_mode()
def time_bf16_products(model: nn.Module, rows: Iterable[int] = BF16_TUNED_ROWS, repeats: int = 2,
                       log: Callable[[str], None] = lambda _: None) -> list[dict]:
    """Seconds per product of torch's bf16 product, the AVX2 kernel on the bf16 weights (where there is one) and
    the fp32 copy, on the model's own RowAdaptiveBf16Linear layers, per weight shape and row count (the rows of
    `time_backends`)."""
    groups = {key: [m for m in layers if isinstance(m, RowAdaptiveBf16Linear)]
              for key, layers in _layers_by_shape(model, torch.bfloat16).items()}
    groups = {key: layers for key, layers in groups.items() if layers}
    names = [*available_bf16_backends(), "bf16-as-fp32"]
    return _time_products(groups, sorted(rows), repeats, names, lambda name, layer, x: layer.product(name, x),
                          torch.bfloat16, log)


def apply_bf16_tables(model: nn.Module, tables: Mapping[str, Mapping], per_row_count: bool = True) -> None:
    """Give every RowAdaptiveBf16Linear its shape's measured choices (`bf16_tables`): per row count and beyond, or,
    with per_row_count False (the batch-invariant setup), only the product beyond its bf16 rows."""
    for layer in model.modules():
        if isinstance(layer, RowAdaptiveBf16Linear) and (table := tables.get(shape_key(layer))):
            if "beyond" not in table or not set(table.values()) <= set(BF16_CHOICES):
                raise ValueError(f"{layer.name}: a bf16 layer needs bf16 kernel tables (time_bf16_products), got "
                                 f"{table}; were an fp32 model's tables passed for a bf16 model?")
            per_rows = {rows: name for rows, name in table.items() if rows != "beyond"}
            layer.set_table(per_rows if per_row_count else None, table["beyond"])


def tune_row_adaptive_bf16(model: nn.Module, rows: Iterable[int] = BF16_TUNED_ROWS, repeats: int = 2,
                           log: Callable[[str], None] = lambda _: None) -> dict[str, dict[int, str]]:
    """Time the bf16 products on the model's own layers (`time_bf16_products`) and give every layer its shape's
    fastest per row count (`apply_bf16_tables`). Which wins depends on the machine: on the AMD EPYC (no native
    bf16) torch's bf16 product loses past a few rows, on an Intel Xeon with AMX it is flat from 1 to 32 rows
    (docs/performance.md). Returns the tables ("out x in" -> {rows: product, "beyond": product})."""
    tables = bf16_tables(time_bf16_products(model, rows, repeats, log))
    apply_bf16_tables(model, tables)
    return tables
