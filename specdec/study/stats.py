"""Statistics: chi-square goodness of fit against an exact distribution, and bootstrap intervals."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy import stats

# Cells whose expected count is below this are pooled, so that the chi-square approximation holds.
MIN_EXPECTED_COUNT = 5.0


@dataclass(frozen=True)
class GoodnessOfFit:
    chi2: float
    dof: int
    p_value: float
    n_samples: int
    impossible: int  # samples that fell on outcomes of probability zero (any such sample is a proof of error)


def pooled_cells(expected: np.ndarray) -> np.ndarray:
    """The cell each outcome is counted in, given its expected count (the pooling chi_square_gof applies).

    Outcomes with expected count below MIN_EXPECTED_COUNT share one pooled cell, placed after the others; when
    that cell is itself below MIN_EXPECTED_COUNT it is folded into the outcome with the largest expected count.
    Returns an integer array (cell index per outcome); the number of cells is its maximum + 1."""
    expected = np.asarray(expected, dtype=float)
    small = expected < MIN_EXPECTED_COUNT
    cells = np.empty(len(expected), dtype=int)
    big = np.flatnonzero(~small)
    cells[big] = np.arange(len(big))
    if small.any():
        if expected[small].sum() >= MIN_EXPECTED_COUNT or not len(big):
            cells[small] = len(big)
        else:  # too little mass to test: fold it into the largest cell so the totals still agree
            cells[small] = cells[big[np.argmax(expected[big])]]
    return cells


def chi_square_gof(samples: Iterable[Hashable], exact: Mapping[Hashable, float]) -> GoodnessOfFit:
    """Chi-square test of the samples against the exact outcome probabilities.

    Outcomes with expected count below MIN_EXPECTED_COUNT are pooled into one cell (and that cell is folded into
    the largest one if it is still too small; see pooled_cells). A sample on an outcome of probability 0 makes the
    p-value 0.
    """
    counts: dict[Hashable, int] = {}
    for sample in samples:
        counts[sample] = counts.get(sample, 0) + 1
    n = sum(counts.values())
    if n == 0:
        raise ValueError("no samples")
    impossible = sum(c for outcome, c in counts.items() if exact.get(outcome, 0.0) <= 0.0)
    support = [outcome for outcome, prob in exact.items() if prob > 0.0]
    total = sum(exact[o] for o in support)
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"exact probabilities sum to {total}, not 1")
    expected = np.array([exact[o] * n for o in support])
    observed = np.array([counts.get(o, 0) for o in support], dtype=float)
    cells = pooled_cells(expected)
    expected, observed = np.bincount(cells, expected), np.bincount(cells, observed)
    if impossible:
        return GoodnessOfFit(float("inf"), max(len(expected) - 1, 0), 0.0, n, impossible)
    if len(expected) < 2:
        # One possible outcome and every sample on it: nothing can deviate.
        return GoodnessOfFit(0.0, 0, 1.0, n, 0)
    chi2, p_value = stats.chisquare(observed, expected * observed.sum() / expected.sum())
    return GoodnessOfFit(float(chi2), len(expected) - 1, float(p_value), n, 0)


def total_variation(a: Mapping[Hashable, float], b: Mapping[Hashable, float]) -> float:
    """Total-variation distance between two distributions over outcomes (missing outcomes have probability 0)."""
    return 0.5 * sum(abs(a.get(o, 0.0) - b.get(o, 0.0)) for o in set(a) | set(b))


def chi_square_power(exact: Mapping[Hashable, float], alternative: Mapping[Hashable, float], n: int,
                     threshold: float) -> float:
    """Probability that chi_square_gof(n samples drawn from `alternative`, exact) gives a p-value below threshold.

    The cells are pooled exactly as chi_square_gof pools them at n samples. Given no sample on an outcome that is
    impossible under `exact`, Pearson's statistic is approximately noncentral chi-square with the test's degrees of
    freedom and noncentrality n * sum over cells (w - e)^2 / e, w and e the cell probabilities under the
    alternative (conditioned on possible outcomes) and under exact (scipy.stats.ncx2). A sample on an impossible
    outcome rejects for sure: with m the alternative's mass there, power = 1 - (1 - m)^n (1 - ncx2 power)."""
    if n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    support = [o for o, prob in exact.items() if prob > 0.0]
    e = np.array([exact[o] for o in support], dtype=float)
    e = e / e.sum()
    w = np.array([alternative.get(o, 0.0) for o in support], dtype=float)
    possible = float(w.sum())
    impossible = min(max(1.0 - possible, 0.0), 1.0)
    no_impossible_sample = (1.0 - impossible) ** n
    if possible <= 0.0:
        return 1.0
    w = w / possible
    cells = pooled_cells(e * n)
    e_cells, w_cells = np.bincount(cells, e), np.bincount(cells, w)
    dof = len(e_cells) - 1
    if dof < 1:
        chi_power = 0.0
    else:
        critical = stats.chi2.isf(threshold, dof)
        noncentrality = n * float(np.sum((w_cells - e_cells) ** 2 / e_cells))
        chi_power = float(stats.ncx2.sf(critical, dof, noncentrality)) if noncentrality > 0 \
            else float(stats.chi2.sf(critical, dof))
        if not np.isfinite(chi_power):  # far in a tail: the mean (dof + noncentrality) against the critical value
            chi_power = 1.0 if dof + noncentrality > critical else 0.0
    return 1.0 - no_impossible_sample * (1.0 - chi_power)


@dataclass(frozen=True)
class SampleSize:
    n: int | None  # the smallest n in [min_samples, max_samples] whose power reaches the target; None: none does
    power: float  # the power at n (at max_samples when n is None)
    n_needed: int | None  # the smallest n with that power whatever the cap (None: no n up to 10^12 reaches it)


def samples_for_power(exact: Mapping[Hashable, float], alternative: Mapping[Hashable, float], threshold: float,
                      power: float = 0.99, max_samples: int = 100_000, min_samples: int = 1) -> SampleSize:
    """The smallest sample size at which chi_square_gof rejects `exact` for samples of `alternative` with at least
    the given power (chi_square_power at the threshold), searched in [min_samples, max_samples]; n_needed is the
    same search without the cap. Power grows with n (up to the small steps pooling makes), so a doubling search
    followed by bisection finds it."""
    if not 1 <= min_samples <= max_samples:
        raise ValueError(f"need 1 <= min_samples <= max_samples, got {min_samples} and {max_samples}")

    def at(n: int) -> float:
        return chi_square_power(exact, alternative, n, threshold)

    limit = 10 ** 12
    if at(min_samples) >= power:
        return SampleSize(min_samples, at(min_samples), min_samples)
    low, high = min_samples, min_samples
    while at(high) < power:  # at(low) < power throughout
        low, high = high, high * 2
        if high > limit:
            return SampleSize(None, at(max_samples), None)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if at(middle) >= power else (middle, high)
    if high <= max_samples:
        return SampleSize(high, at(high), high)
    return SampleSize(None, at(max_samples), high)


def bootstrap_median_interval(values: np.ndarray, confidence: float = 0.95, seed: int = 0,
                              n_resamples: int = 2000) -> tuple[float, float, float]:
    """Median and a percentile bootstrap interval for it."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return float("nan"), float("nan"), float("nan")
    median = float(np.median(values))
    if len(values) == 1:
        return median, median, median
    result = stats.bootstrap((values,), np.median, confidence_level=confidence, n_resamples=n_resamples,
                             method="percentile", random_state=np.random.default_rng(seed))
    return median, float(result.confidence_interval.low), float(result.confidence_interval.high)
