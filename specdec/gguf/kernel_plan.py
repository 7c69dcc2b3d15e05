"""The product kernel and each matrix class's layout that a GGUF model loads with, chosen on this machine by measuring.

Every kernel and layout gives the same bits (tests/test_quant.py), so the choice changes speed only, and the fastest
one differs between CPUs. On the Intel Xeon, the Q6_K head streams at 26 GB/s in the file's rows and at 19 GB/s in
groups of 16, while the layers run faster in groups. A CPU that runs 512-bit instructions as two 256-bit halves (the
AMD Zen 4) may prefer the avx512-vnni-256 kernel.

A file's plan is measured the first time it loads on a machine (for its thread count and native build). The
candidates are every (kernel, layout) this CPU runs, and the file's multiplied matrices fall into classes: the
layers' matrices of one type ("Q4_K", "Q6_K", ...) and the LM head ("head"). For each class, every candidate times
its products over all the class's matrices, so that they stream from memory as in a step. It does so at 1 and 4
rows (a step and a verify pass of k 3), with the candidates interleaved, REPEATS times (the scores recorded: the
sum of the two medians).

Each model runs its own plan (a session sets its kernel around each of its passes, `quant.session_kernel`), so a
draft file is measured as freely as its target; one native call runs a pass's layers, so they run one kernel (the
head: the kernel for the logits asked for, `LeanLM._pass`). A one-token step runs `kernel`, the one whose classes'
best layouts sum lowest at 1 row, each class in its best layout there (`layouts`); a pass of 2 rows or more (up to
`attention.INVARIANT_ROWS`) runs `verify_kernel`, the one lowest at 4 rows, where it is another, each class in its
best layout there. A candidate replaces the default (the last kernel of `quant.kernels()` on
`quant.default_layout`'s layouts) only when it scores at least MARGIN lower, so noise does not flip a plan. A class
whose layout for a verify pass differs from its step's keeps both (`verify_layouts`): the model holds that class's
matrices twice, and passes of 2 rows or more run the second copy (the head: passes of 2 logits or more). AMD EPYC
Zen 4: the Q6_K layers and the Q6_K head in the file's rows for a step, in groups for a verify pass; the 1.5B file's
second head is 191 MB more memory. Both copies give the same bits. Intel Xeon (experiments/cpu-lead, twenty-second
run): avx2 steps 39.5 ms, amx's 52-55; amx's passes of 2-7 rows 0.74-0.93 of avx2's.

A prompt pass (more rows than `attention.INVARIANT_ROWS`, layer by layer in Python) multiplies many rows per weight
read, where the kernels rank otherwise: every kernel times the layers' products at PROMPT_ROWS rows (the first
PROMPT_MATRICES matrices of each class, in the layout passes of several rows run), and the one chosen as the others
are (the default unless another is faster by MARGIN) becomes its `prompt_kernel` where it is not the step's. Intel
Xeon: a prompt of 512 positions 89 tokens/s on avx2, 154 on amx, whose tiles multiply 16 rows at once.

Plans are cached as JSON, written atomically, in $SPECDEC_CACHE or ~/.cache/specdec. The steps' kernel name and
provenance record them. Files under MIN_BYTES of weights (the tests' tiny models) take the default without
measuring. $SPECDEC_KERNEL_PLAN=off always takes the default; =remeasure ignores the cache. So does naming a kernel
($SPECDEC_QUANT_KERNEL, `quant.use_kernel`) or $SPECDEC_QUANT_LAYOUT=rows: that choice wins."""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from specdec.gguf import quant
from specdec.gguf.quant import QuantMatrix

PLAN_ENV = "SPECDEC_KERNEL_PLAN"
CACHE_ENV = "SPECDEC_CACHE"
MIN_BYTES = 64 << 20  # below this a file's products sit in cache: timing them says nothing about a step
ROWS = (1, 4)         # a decoding step and a verify pass of k 3
PROMPT_ROWS = 64      # a prompt pass's rows per product, as timed for its kernel
PROMPT_MATRICES = 8   # of each class, for that timing: many rows make a product compute-bound, so a few are enough
REPEATS = 5
MARGIN = 0.05         # a candidate must beat the default by this fraction to replace it (copies of one matrix
                      # in other memory differ by a few percent on a busy host: not a reason)
HEAD = "head"
RULES = 5             # how a plan is chosen from its timings; a plan cached under other rules is measured again
                      # (2: the head may keep a second copy for passes of several logits, as the layers' classes;
                      # 3: avx2 has groups of 16 rows among its candidates, Q4_K's by default;
                      # 4: Q8_0's groups run natively on avx2 too, and Q5_0 and Q8_0 load in groups there by default;
                      # 5: each file measured on every kernel, whatever an earlier file chose; the kernels of verify
                      # and prompt passes)


@dataclass(frozen=True)
class KernelPlan:
    """kernel: the product kernel the model's one-token steps run on; layouts: class -> "rows" or "r16" (a class not
    named takes `quant.preferred_layout`'s); verify_layouts: class -> the layout of its second copy, for passes of 2
    rows or more (the head's: of 2 logits or more; only the classes that have one); scores: class -> candidate
    ("kernel/layout") -> ms (the measurement, for provenance); source: "default", "measured" or "cache";
    verify_kernel, prompt_kernel: the kernel of passes of 2 rows or more, of prompt passes, where one other than
    `kernel` is clearly faster there, else None."""

    kernel: str
    layouts: dict[str, str] = field(default_factory=dict)
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    source: str = "default"
    verify_layouts: dict[str, str] = field(default_factory=dict)
    prompt_kernel: str | None = None
    verify_kernel: str | None = None

    def pass_kernel(self, rows: int, prompt: bool) -> str:
        """The kernel a pass of `rows` runs on: a prompt pass (more rows than attention.INVARIANT_ROWS, `prompt`) on
        `prompt_kernel`, another pass of 2 rows or more on `verify_kernel`, where the plan has them; else
        `kernel`."""
        if prompt:
            return self.prompt_kernel or self.kernel
        return (self.verify_kernel or self.kernel) if rows > 1 else self.kernel

    def layout(self, cls: str, qtype: str, rows: int) -> str:
        """The layout of a matrix of class `cls` (its type, `rows` high)."""
        layout = self.layouts.get(cls)
        if layout is None:
            return quant.preferred_layout(qtype, rows)
        return self._fitted(layout, qtype, rows)

    def verify_layout(self, cls: str, qtype: str, rows: int) -> str | None:
        """The layout of the second copy that passes of 2 rows or more run, for a matrix of class `cls`; None where
        the class has none, or the type or height cannot take it (those passes run the one copy)."""
        layout = self.verify_layouts.get(cls)
        if layout is None or self._fitted(layout, qtype, rows) != layout:
            return None
        return layout

    def _fitted(self, layout: str, qtype: str, rows: int) -> str:
        """`layout`, or the file's rows where it is groups of 16 that this matrix cannot take (its type or height,
        or $SPECDEC_QUANT_LAYOUT=rows)."""
        return "rows" if layout == "r16" and not quant.can_group(qtype, rows) else layout

    def label(self) -> str:
        """What a step records: the kernel, "-r16" where the layers are in groups of 16 rows, and each class whose
        layout differs from the layers' ("avx512-vnni-r16+head-rows")."""
        if not self.layouts:
            return quant.kernel_label()
        grouped = "r16" in [layout for cls, layout in self.layouts.items() if cls != HEAD]
        odd = sorted(cls for cls, layout in self.layouts.items() if (layout == "r16") != grouped)
        return ((f"{self.kernel}-r16" if grouped else self.kernel)
                + "".join(f"+{cls}-{self.layouts[cls]}" for cls in odd)
                + "".join(f"+verify-{cls}-{layout}" for cls, layout in sorted(self.verify_layouts.items()))
                + (f"+verify-{self.verify_kernel}" if self.verify_kernel else "")
                + (f"+prompt-{self.prompt_kernel}" if self.prompt_kernel else ""))

    def as_record(self) -> dict:
        record = {"kernel": self.kernel, "layouts": dict(sorted(self.layouts.items())), "source": self.source,
                  "scores_ms": self.scores}
        if self.verify_layouts:
            record["verify_layouts"] = dict(sorted(self.verify_layouts.items()))
        for name, kernel in (("verify_kernel", self.verify_kernel), ("prompt_kernel", self.prompt_kernel)):
            if kernel:
                record[name] = kernel
        return record


def default_plan() -> KernelPlan:
    return KernelPlan(kernel=quant.kernel_name())


def _mode() -> str:
    mode = os.environ.get(PLAN_ENV, "auto")
    if mode not in ("auto", "off", "remeasure"):
        raise ValueError(f"{PLAN_ENV}={mode!r}: expected 'auto', 'off' or 'remeasure'")
    return mode


def _named_elsewhere() -> bool:
    """Whether the kernel or the layout was named by the user or a test: then that choice stands, unmeasured."""
    return (quant.kernel_override() is not None or bool(os.environ.get(quant.KERNEL_ENV))
            or os.environ.get(quant.LAYOUT_ENV, "auto") == "rows")


def cache_path() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "specdec") / "kernel_plans.json"


def machine_key(threads: int | None = None) -> str:
    """The CPU (model name, family, model), the kernels it runs, the thread count (this process's unless given), the
    native build and the RULES of choosing: a plan holds for these only."""
    from specdec.native.build import kernel_build

    info = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "cpu family", "model") and key.strip() not in info:
                info[key.strip()] = value.strip()
    except OSError:
        pass
    cpu = "/".join(info.get(k, "?") for k in ("model name", "cpu family", "model"))
    threads = threads or torch.get_num_threads()
    return f"{cpu}|{','.join(quant.kernels())}|threads {threads}|{kernel_build()}|rules {RULES}"


def _file_key(path: Path) -> str:
    return f"{path.name}|{path.stat().st_size}"


def _read_cache() -> dict:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: measured again and rewritten


def _write_cache(entries: dict) -> None:
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump(entries, f, indent=1, sort_keys=True)
        os.replace(f.name, path)  # atomic: a reader sees the old plans or the new, never half
    except OSError as error:  # a read-only home: the plan still holds for this process
        print(f"specdec: kernel plan not cached ({error})", file=sys.stderr)


def cached_plan(path, threads: int | None = None) -> KernelPlan | None:
    """The cached plan of this file on this machine, for `threads` (a job that reports on runs of another thread
    count than its own), else this process's count."""
    entry = _read_cache().get(machine_key(threads), {}).get(_file_key(Path(path)))
    if not entry:
        return None
    return KernelPlan(kernel=entry["kernel"], layouts=entry["layouts"], scores=entry.get("scores_ms", {}),
                      source="cache", verify_layouts=entry.get("verify_layouts", {}),
                      prompt_kernel=entry.get("prompt_kernel"), verify_kernel=entry.get("verify_kernel"))


def _time_class(matrices: dict[str, list[QuantMatrix]], candidates,
                inputs) -> dict[tuple[str, str], dict[int, float]]:
    """Median ms over REPEATS of every candidate's products over the class's matrices, per row count of ROWS.
    inputs: (rows, width) -> activations."""
    times = {(c, m): [] for c in candidates for m in ROWS}
    cells = list(times)
    for repeat in range(REPEATS):
        for (kernel, layout), m in cells[repeat % len(cells):] + cells[:repeat % len(cells)]:
            with quant.use_kernel(kernel):
                start = time.perf_counter()
                for matrix in matrices[layout]:
                    matrix.matmul(inputs[m, matrix.in_features])
                times[(kernel, layout), m].append(time.perf_counter() - start)
    return {c: {m: statistics.median(times[c, m]) * 1e3 for m in ROWS} for c in candidates}


def measure(path, classes: dict[str, list[QuantMatrix]]) -> KernelPlan:
    """Time every candidate on each class (matrices in the file's rows; their groups of 16 made here) and choose."""
    candidates = [(k, layout) for k in quant.kernels() for layout in quant.LAYOUTS]
    default_kernel = quant.kernels()[-1]
    by_rows: dict[str, dict[tuple[str, str], dict[int, float]]] = {}
    samples: dict[str, dict[str, list[QuantMatrix]]] = {}  # class -> layout -> its first matrices (a prompt's timing)
    for cls, rows in classes.items():
        # the groups of 16 rows only where every matrix of the class can take them: no copy otherwise
        grouped = all(quant.can_group(m.qtype, m.out_features) for m in rows)
        layouts = {"rows": rows, **({"r16": [m.in_layout("r16") for m in rows]} if grouped else {})}
        usable = [(k, layout) for k, layout in candidates if layout == "rows" or grouped]
        inputs = {(m, k): torch.randn(m, k) for m in ROWS for k in {matrix.in_features for matrix in rows}}
        for layout_matrices in layouts.values():  # first touch, outside the timing
            for matrix in layout_matrices:
                matrix.matmul(inputs[1, matrix.in_features])
        print(f"specdec: timing {len(usable)} kernel/layout candidates on {path.name}'s {cls} matrices",
              file=sys.stderr, flush=True)
        by_rows[cls] = _time_class(layouts, usable, inputs)
        samples[cls] = {layout: matrices[:PROMPT_MATRICES] for layout, matrices in layouts.items()}
    scores = {cls: {c: sum(ms.values()) for c, ms in s.items()} for cls, s in by_rows.items()}

    def best_layout(cls: str, k: str, rows: int) -> tuple[str, float]:
        """The class's layout on kernel k by its time at this row count."""
        options = {layout: times[rows] for (kk, layout), times in by_rows[cls].items() if kk == k}
        default = quant.default_layout(classes[cls][0].qtype, k)
        pick = _pick(options, default if default in options else "rows")
        return pick, options[pick]

    def best_kernel(rows: int) -> str:
        """The kernel whose classes' best layouts sum lowest at this row count (the default unless beaten by
        MARGIN)."""
        return _pick({k: sum(best_layout(cls, k, rows)[1] for cls in scores) for k in quant.kernels()}, default_kernel)

    # a step (1 row) and a verify pass (4) each on the kernel fastest there, each class in its best layout on it:
    # a second copy where the two layouts differ
    chosen, verify = best_kernel(ROWS[0]), best_kernel(ROWS[-1])
    layouts, verify_layouts = {}, {}
    for cls in scores:
        layouts[cls], many = best_layout(cls, chosen, ROWS[0])[0], best_layout(cls, verify, ROWS[-1])[0]
        if many != layouts[cls]:
            verify_layouts[cls] = many
    plan = KernelPlan(kernel=chosen, layouts=layouts, verify_layouts=verify_layouts,
                      scores={cls: {f"{k}/{layout}": round(ms, 3) for (k, layout), ms in s.items()}
                              for cls, s in scores.items()},
                      source="measured", verify_kernel=verify if verify != chosen else None)
    return replace(plan, prompt_kernel=_prompt_kernel(path, samples, plan))


def _pick(times: dict[str, float], default: str) -> str:
    """The fastest of `times` where it beats `default` by MARGIN, else `default` (noise does not flip a plan)."""
    best = min(times, key=times.get)
    return best if times[best] <= times[default] * (1 - MARGIN) else default


def _prompt_kernel(path, samples: dict[str, dict[str, list[QuantMatrix]]], plan: KernelPlan) -> str | None:
    """The kernel a prompt pass runs on, chosen as the plan's others are (the default unless another is faster by
    MARGIN) at PROMPT_ROWS rows over the layers' classes' first matrices (`samples`: class -> layout -> matrices; a
    prompt computes one logit, so the head is not timed), each class in the layout passes of several rows run; None
    where it is the plan's step kernel."""
    laid = [matrix for cls, by_layout in samples.items() if cls != HEAD
            for matrix in by_layout[plan.verify_layouts.get(cls, plan.layouts[cls])]]
    if len(quant.kernels()) < 2 or not laid:
        return None
    print(f"specdec: timing {len(quant.kernels())} kernels on {Path(path).name}'s layers at {PROMPT_ROWS} rows (a "
          f"prompt pass)", file=sys.stderr, flush=True)
    kernel = _pick(_time_prompt(laid), quant.kernels()[-1])
    return kernel if kernel != plan.kernel else None


def _time_prompt(matrices: list[QuantMatrix]) -> dict[str, float]:
    """Median ms over REPEATS of each kernel's products over these matrices at PROMPT_ROWS rows, interleaved (the
    matrices the class timing already multiplied: in memory)."""
    inputs = {width: torch.randn(PROMPT_ROWS, width) for width in {matrix.in_features for matrix in matrices}}
    kernels = list(quant.kernels())
    times: dict[str, list[float]] = {kernel: [] for kernel in kernels}
    for repeat in range(REPEATS):
        for kernel in kernels[repeat % len(kernels):] + kernels[:repeat % len(kernels)]:
            with quant.use_kernel(kernel):
                start = time.perf_counter()
                for matrix in matrices:
                    matrix.matmul(inputs[matrix.in_features])
                times[kernel].append(time.perf_counter() - start)
    return {kernel: statistics.median(ms) * 1e3 for kernel, ms in times.items()}


def plan_for(path, classes) -> KernelPlan:
    """The plan a file loads with. classes: a callable giving class -> its matrices in the file's rows (called only
    when a measurement is due, since it copies the weights). Every file is measured on every kernel (its sessions run
    its own); the process's first plan also sets the kernel of products run outside a session."""
    path, mode = Path(path), _mode()
    if mode == "off" or not quant.available() or _named_elsewhere():
        return default_plan()
    if mode == "auto":
        found = cached_plan(path)
        if found:
            _set_process_kernel(found.kernel)
            return found
    matrices = classes()
    if sum(m.nbytes for ms in matrices.values() for m in ms) < MIN_BYTES:
        return default_plan()
    plan = measure(path, matrices)
    _set_process_kernel(plan.kernel)
    entries = _read_cache()
    entries.setdefault(machine_key(), {})[_file_key(path)] = plan.as_record()
    _write_cache(entries)
    return plan


def _set_process_kernel(kernel: str) -> None:
    if quant.planned_kernel() is None:
        quant.set_planned_kernel(kernel)
