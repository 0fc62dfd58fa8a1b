"""Seed statistics of a comparison: the gap to bf16 as a mean with a 95% confidence interval.

The gap of a recipe on seed s is d_s = 100 * (L_recipe,s - L_bf16,s) / L_bf16,s (percent; positive = worse than
bf16), both runs trained with the same seed (same initialisation and data order). The differences are PAIRED:
whatever a seed does to both runs alike cancels in d_s, so the interval is much narrower than one built from
the two recipes' losses separately.

With n seeds: mean = sum(d_s) / n, sd = sqrt(sum((d_s - mean)^2) / (n - 1)), and the 95% interval is
mean +- t * sd / sqrt(n), t the 97.5% quantile of Student's t with n - 1 degrees of freedom (12.71 for n = 2,
4.30 for n = 3, 2.78 for n = 5). One seed gives no interval: there is no spread to estimate.

The noise band is what a SINGLE seed's gap can show with no real difference: t * sd_pooled, where sd_pooled
is the spread of the paired gaps of every recipe run with several seeds (each around its own mean), with
sum(n_i - 1) degrees of freedom. A single-seed gap inside it cannot be told apart from seed noise.
"""

from __future__ import annotations

import dataclasses
import math


def t_quantile_975(dof: int) -> float:
    """The 97.5% quantile of Student's t distribution with `dof` degrees of freedom (two-sided 95%)."""
    from scipy.stats import t  # scipy comes with jax

    return float(t.ppf(0.975, dof))


def relative_gap_pct(value: float | None, baseline: float | None) -> float | None:
    if value is None or baseline is None or baseline == 0:
        return None
    return 100.0 * (value - baseline) / baseline


@dataclasses.dataclass(frozen=True)
class GapInterval:
    """The paired gap to bf16 over the seeds both runs have (`low`/`high`: None with one seed)."""

    seeds: tuple[int, ...]
    per_seed_pct: tuple[float, ...]
    mean_pct: float
    sd_pct: float | None
    low_pct: float | None
    high_pct: float | None

    @property
    def n(self) -> int:
        return len(self.seeds)

    @property
    def within_noise(self) -> bool | None:
        """True when the 95% interval contains 0 (no interval: None)."""
        if self.low_pct is None or self.high_pct is None:
            return None
        return self.low_pct <= 0.0 <= self.high_pct

    def to_dict(self) -> dict:
        return {
            "seeds": list(self.seeds),
            "per_seed_pct": list(self.per_seed_pct),
            "mean_pct": self.mean_pct,
            "sd_pct": self.sd_pct,
            "ci95_pct": None if self.low_pct is None else [self.low_pct, self.high_pct],
            "n": self.n,
            "within_noise": self.within_noise,
        }


def mean_and_sd(values: list[float]) -> tuple[float, float | None]:
    """The mean and the sample standard deviation (n - 1 in the denominator; None for one value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def paired_gap(losses: dict[int, float | None], baseline: dict[int, float | None]) -> GapInterval | None:
    """The gap interval from the seeds present (with a finite loss) in both `losses` and `baseline` (seed -> loss)."""
    seeds = tuple(sorted(s for s in losses if s in baseline and losses[s] is not None and baseline[s] is not None))
    if not seeds:
        return None
    gaps = [relative_gap_pct(losses[s], baseline[s]) for s in seeds]
    values = [g for g in gaps if g is not None]
    if len(values) != len(seeds):
        return None
    mean, sd = mean_and_sd(values)
    low = high = None
    if sd is not None:
        half = t_quantile_975(len(values) - 1) * sd / math.sqrt(len(values))
        low, high = mean - half, mean + half
    return GapInterval(seeds=seeds, per_seed_pct=tuple(values), mean_pct=mean, sd_pct=sd, low_pct=low, high_pct=high)


def noise_band(intervals: list[GapInterval]) -> dict | None:
    """The 95% range of one seed's gap when nothing differs, from the multi-seed intervals (None if there are none)."""
    several = [interval for interval in intervals if interval.n >= 2]
    if not several:
        return None
    squares = sum(sum((g - i.mean_pct) ** 2 for g in i.per_seed_pct) for i in several)
    dof = sum(interval.n - 1 for interval in several)
    sd = math.sqrt(squares / dof)
    return {"band_pct": t_quantile_975(dof) * sd, "sd_pct": sd, "dof": dof}


def seed_spread_pct(losses: list[float]) -> float | None:
    """Seed-to-seed spread of one recipe's final loss: sample sd as a percentage of its mean (None for one seed)."""
    mean, sd = mean_and_sd(losses)
    return None if sd is None or mean == 0 else 100.0 * sd / mean
