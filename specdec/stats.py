"""Statistics: chi-square goodness of fit against an exact distribution, and bootstrap intervals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping

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


def chi_square_gof(samples: Iterable[Hashable], exact: Mapping[Hashable, float]) -> GoodnessOfFit:
    """Chi-square test of the samples against the exact outcome probabilities.

    Outcomes with expected count below MIN_EXPECTED_COUNT are pooled into one cell (and that cell is dropped if
    it is still too small). A sample on an outcome of probability 0 makes the p-value 0.
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
    small = expected < MIN_EXPECTED_COUNT
    if small.any():
        pooled_expected, pooled_observed = expected[small].sum(), observed[small].sum()
        expected, observed = expected[~small], observed[~small]
        if pooled_expected >= MIN_EXPECTED_COUNT:
            expected = np.append(expected, pooled_expected)
            observed = np.append(observed, pooled_observed)
        else:  # too little mass to test: fold it into the largest cell so the totals still agree
            largest = np.argmax(expected)
            expected[largest] += pooled_expected
            observed[largest] += pooled_observed
    if impossible:
        return GoodnessOfFit(float("inf"), max(len(expected) - 1, 0), 0.0, n, impossible)
    if len(expected) < 2:
        # One possible outcome and every sample on it: nothing can deviate.
        return GoodnessOfFit(0.0, 0, 1.0, n, 0)
    chi2, p_value = stats.chisquare(observed, expected * observed.sum() / expected.sum())
    return GoodnessOfFit(float(chi2), len(expected) - 1, float(p_value), n, 0)


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
