"""Kernel tables: the timings that the time_linear_backends and time_bf16_products stages write, turned into the
product each weight shape runs per row count (what a model loads with, specdec.fp32.kernels) or written compactly for
provenance. No torch here: the workflow's table stages read these without importing it."""

from __future__ import annotations

from typing import Iterable, Mapping

# Products of a bf16 weight (specdec.fp32.kernels.BF16_PRODUCTS): torch's own bf16 product; the AVX2 kernel reading the
# bf16 weights.
BF16_BACKENDS = ("bf16", "avx2-bf16")
# What a bf16 layer can run a product on: a bf16 product, or the fp32 copy of the same values.
BF16_CHOICES = (*BF16_BACKENDS, "bf16-as-fp32")


def fastest_backends(timings: Iterable[Mapping]) -> dict[str, dict[int, str]]:
    """Per weight shape and row count, the backend with the least median seconds (`time_backends` rows)."""
    best: dict[tuple[str, int], Mapping] = {}
    for row in timings:
        key = (row["shape"], int(row["rows"]))
        if key not in best or row["seconds"] < best[key]["seconds"]:
            best[key] = row
    tables: dict[str, dict[int, str]] = {}
    for (shape, rows), row in sorted(best.items()):
        tables.setdefault(shape, {})[rows] = row["backend"]
    return tables


def bf16_tables(timings: Iterable[Mapping]) -> dict[str, dict]:
    """Per weight shape, the fastest bf16 product per timed row count and, under "beyond", the faster at the
    largest timed count of the two that scale with rows (torch's bf16, the fp32 copy): the AVX2 kernel reads every
    weight once per 16 rows and falls behind both on a prompt pass."""
    timings = list(timings)
    largest = max(int(t["rows"]) for t in timings)
    tables = fastest_backends(timings)
    scaling = fastest_backends([t for t in timings if int(t["rows"]) == largest and t["backend"] != "avx2-bf16"])
    return {key: {**table, "beyond": scaling[key][largest]} for key, table in tables.items()}


def tables_from_timings(timings: Iterable[Mapping]) -> dict[str, dict]:
    """A kernel table file's timings as the tables a model loads with: bf16 ones (`bf16_tables`) when they time
    bf16 products, else the fastest fp32 backend per shape and row count (`fastest_backends`)."""
    timings = list(timings)
    if timings and all(t["backend"] in BF16_CHOICES for t in timings):
        return bf16_tables(timings)
    return fastest_backends(timings)


def backend_spans(tables: Mapping[str, Mapping[int, str]]) -> dict[str, dict[str, str]]:
    """`fastest_backends` tables written compactly, per shape runs of row counts: {"1-3": "avx2", "4": "linear"}."""
    spans_by_shape = {}
    for shape, table in tables.items():
        spans: list[list] = []  # [first rows, last rows, backend]
        for rows, backend in sorted((rows, name) for rows, name in table.items() if rows != "beyond"):
            if spans and spans[-1][2] == backend and spans[-1][1] == rows - 1:
                spans[-1][1] = rows
            else:
                spans.append([rows, rows, backend])
        spans_by_shape[shape] = {(str(a) if a == b else f"{a}-{b}"): name for a, b, name in spans}
        if "beyond" in table:  # a bf16 table's prompt-pass product
            spans_by_shape[shape]["beyond"] = table["beyond"]
    return spans_by_shape
