"""The distribution check's settings and its verdict on a judged family: what the table stage needs, without torch
(the checks themselves are specdec.study.verify.distribution, which builds on these)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

# The first wrong sampler of specdec.study.verify.distribution.WRONG_SAMPLERS (a test there keeps the two the same): the
# one a table row without a `wrong_sampler` column was checked against.
FIRST_WRONG_SAMPLER = "residual drawn from p"


@dataclass(frozen=True)
class DistributionSettings:
    """The verify_distribution stage's settings (config key distribution_check; see docs/distribution-check.md)."""

    temperature: float = 1.0
    top_k: int = 5
    tokens: int = 3
    k: tuple[int, ...] = (1, 4)
    prompts_per_domain: int = 2
    seed: int = 0
    alpha: float = 0.01  # family-wise; each test at alpha / (number of tests)
    power: float = 0.99  # the power each test must have against a wrong sampler
    max_samples: int = 100_000  # the cap on N
    min_samples: int = 1_000  # the floor on N
    samples: int | None = None  # a fixed N for every test instead of sizing (older configs)
    min_powered_share: float | None = None  # share of tests that must have power (None: one per (draft, domain))

    def __post_init__(self):
        if self.samples is not None and not (isinstance(self.samples, int) and self.samples >= 1):
            raise ValueError(f"config key 'distribution_check.samples': a positive integer, got {self.samples!r}")
        if not 1 <= self.min_samples <= self.max_samples:
            raise ValueError(f"config keys 'distribution_check.min_samples' ({self.min_samples}) and "
                             f"'distribution_check.max_samples' ({self.max_samples}): need 1 <= min <= max")
        if not 0.0 < self.power < 1.0:
            raise ValueError(f"config key 'distribution_check.power': in (0, 1), got {self.power}")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"config key 'distribution_check.alpha': in (0, 1), got {self.alpha}")
        if self.min_powered_share is not None and not 0.0 <= self.min_powered_share <= 1.0:
            raise ValueError(f"config key 'distribution_check.min_powered_share': in [0, 1], got "
                             f"{self.min_powered_share}")

    @classmethod
    def from_config(cls, section: Mapping | None) -> DistributionSettings:
        """From the config's distribution_check section (drafts, which the workflow reads, is left out).
        `samples` keeps its old meaning, a fixed N for every test; where it is set, min_samples and max_samples
        are not used (so that a config layered over one with a cap can still ask for a fixed N)."""
        section = {key: value for key, value in (section or {}).items() if key != "drafts"}
        if "k" in section:
            section["k"] = tuple(section["k"])
        return cls(**section)

    def family_size(self, n_jobs: int) -> int:
        """Tests in the family when n_jobs (draft, domain) jobs each check prompts_per_domain prompts at every k
        (an upper bound when a domain has fewer prompts: the test is then judged at a larger threshold)."""
        return max(1, n_jobs) * self.prompts_per_domain * len(self.k)


# --- outcomes ----------------------------------------------------------------------------------------------------
def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _test_name(row) -> str:
    return f"draft {row['draft']}, domain {row['domain']}, prompt {row['prompt_id']}, k={row['k']}"


def failure_messages(table, min_powered_share: float | None = None, fixed_n: bool = False) -> list[str]:
    """Why a judged family (analysis.judge_distribution_checks) fails, one message per failed test and one for the
    family when too few tests have power (min_powered_share; None: at least one per (draft, domain)). Each names
    the test, the TV distance and what to change in the config. Empty: the family passes."""
    n_key = "distribution_check.samples" if fixed_n else "distribution_check.max_samples"
    messages = []
    for row in table.to_dict("records"):
        name, tv = _test_name(row), row.get("tv_distance", float("nan"))
        threshold = row["threshold"]
        if row["impossible"] > 0:
            messages.append(f"{name}: {row['impossible']} of {row['n_samples']} speculative samples fell on "
                            "continuations the target gives probability 0: the decoding loop is not exact")
        elif row["p_value"] <= threshold:
            messages.append(f"{name}: the speculative samples do not follow the target's exact law (p = "
                            f"{row['p_value']:.3g} <= threshold {threshold:.3g}, N = {row['n_samples']}): an "
                            "exactness failure, unless it is the family-wise false alarm (probability "
                            "distribution_check.alpha); rerun with another distribution_check.seed to tell them apart")
        elif row.get("has_power", True) and row["wrong_sampler_p_value"] >= threshold:
            messages.append(f"{name}: the wrong sampler '{row.get('wrong_sampler', FIRST_WRONG_SAMPLER)}' (TV "
                            f"distance {tv:.4g} from the target's law) was not rejected (p = "
                            f"{row['wrong_sampler_p_value']:.3g}, threshold {threshold:.3g}) although the test had "
                            f"power {row.get('power', float('nan')):.3f} at N = {row['n_samples']}: a miss of "
                            "probability 1 - power, or the check itself is broken; rerun with another "
                            "distribution_check.seed, or raise distribution_check.power")
    if "has_power" not in table.columns or not len(table):
        return messages
    powered = table["has_power"].astype(bool)
    unpowered = table[~powered]
    if min_powered_share is None:
        per_job = powered.groupby([table["draft"], table["domain"]]).any()
        short = [f"{draft}/{domain}" for (draft, domain), ok in per_job.items() if not ok]
        problem = f"(draft, domain) {', '.join(short)} {'has' if len(short) == 1 else 'have'} no test with power " \
                  "(distribution_check.min_powered_share unset: at least one per draft and domain)" if short else None
    else:
        share = float(powered.mean())
        problem = f"only {int(powered.sum())} of {len(table)} tests ({share:.0%}) have power, fewer than " \
                  f"distribution_check.min_powered_share = {min_powered_share}" if share < min_powered_share else None
    if problem:
        details = []
        for row in unpowered.to_dict("records"):
            need = row.get("n_needed")
            need = "no N can tell them apart (the laws are equal there: draft and target agree on these prefixes)" \
                if _missing(need) else f"it would need N = {int(need)}"
            details.append(f"  {_test_name(row)}: TV distance {row.get('tv_distance', float('nan')):.4g} "
                           f"('{row.get('wrong_sampler')}', power {row.get('power', float('nan')):.3f} at "
                           f"N = {row['n_samples']}); {need}")
        needs = [int(n) for n in unpowered.get("n_needed", []) if not _missing(n)]
        raise_to = f" to at least {min(needs)}" if needs else ""
        messages.append(
            f"{problem}: these tests could not have failed, so they show nothing about exactness. Tests without "
            f"power (at power {table['target_power'].iloc[0] if 'target_power' in table else 'target'}):\n"
            + "\n".join(details)
            + f"\nRaise {n_key}{raise_to}, or check more prompts (distribution_check.prompts_per_domain) or other k "
            "(distribution_check.k), or lower distribution_check.min_powered_share.")
    return messages
