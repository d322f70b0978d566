"""Speedups and location intervals from paired log ratios: Hodges-Lehmann with a Wilcoxon signed-rank interval.

Used by the per-trial paired measurement (`tuner.measure.paired`, one log ratio per ABBA cycle of
blocks) and by the end-of-study confirmation (`tuner.worker.confirm`, one log ratio per round of
fresh processes). A pair yields d = log(default / candidate), measured under the same machine
conditions, so slow drift (thermal state, a noisy neighbour, clock changes) cancels. The speedup is
exp of the Hodges-Lehmann estimate of the d's (the median of their Walsh averages) and its interval
is the matching Wilcoxon signed-rank interval: from the exact null distribution for up to
`EXACT_MAX` pairs, from its normal approximation (with continuity correction) above that. The
interval assumes only that the pairs are independent and the d's symmetric about their centre: no
normality, and one disturbed pair cannot drag the estimate.

Several measurements of one trial (racing re-measures it in fresh processes) are not one sample:
a process's state (where its threads and buffers land) moves its ratio for its whole life, so the
cycles of one process are not independent of each other. `pooled_speedup` combines measurements
as a random-effects meta-analysis (DerSimonian-Laird, normal interval) of their estimates: the
spread between measurements widens the interval beyond what their cycles alone would claim.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np

EXACT_MAX = 30  # the exact null distribution costs O(n^3); the normal approximation is excellent beyond this
FIT_CONFIDENCE = 0.95  # the level at which a pooled measurement's own interval is read for its variance


@dataclass(frozen=True)
class Speedup:
    """A speedup factor (default latency / candidate latency) with its confidence interval."""

    estimate: float
    low: float
    high: float
    confidence: float  # the interval's coverage (exact up to EXACT_MAX pairs, else approximate; >= the level asked for)
    rounds: int

    @property
    def significant(self) -> bool:
        """The candidate is faster than the default at this confidence (the interval excludes 1.0)."""
        return self.low > 1.0

    @property
    def slower(self) -> bool:
        """The candidate is slower than the default at this confidence."""
        return self.high < 1.0

    @property
    def halfwidth(self) -> float:
        """The interval's relative half-width: sqrt(high / low) - 1 (0.02 means about ±2 %)."""
        return math.sqrt(self.high / self.low) - 1.0

    def to_dict(self) -> dict[str, float | int]:
        """JSON-able form."""
        return {
            "speedup": self.estimate,
            "low": self.low,
            "high": self.high,
            "confidence": self.confidence,
            "rounds": self.rounds,
        }


@lru_cache(maxsize=EXACT_MAX + 1)
def signed_rank_counts(n: int) -> list[int]:
    """How many of the 2**n sign patterns give each value 0..n(n+1)/2 of the signed-rank statistic."""
    counts = [1]
    for rank in range(1, n + 1):
        grown = counts + [0] * rank
        for total, c in enumerate(counts):
            grown[total + rank] += c
        counts = grown
    return counts


def min_rounds(confidence: float) -> int:
    """The fewest pairs whose widest signed-rank interval reaches `confidence` (two-sided)."""
    n = 1
    while 2.0 / 2**n > 1.0 - confidence:
        n += 1
    return n


@lru_cache(maxsize=1024)
def _critical(n: int, confidence: float) -> tuple[int, float]:
    """(k, coverage): the interval is the k-th smallest to k-th largest Walsh average (1-based)."""
    alpha = 1.0 - confidence
    if n <= EXACT_MAX:
        counts, total = signed_rank_counts(n), 2**n
        # Largest k with P(T <= k-1) <= alpha/2.
        k, tail = 0, 0
        while (tail + counts[k]) / total <= alpha / 2:
            tail += counts[k]
            k += 1
        return k, 1.0 - 2.0 * tail / total
    mean, sd = n * (n + 1) / 4.0, math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
    k = max(1, int(math.floor(mean - NormalDist().inv_cdf(1.0 - alpha / 2) * sd + 0.5)))
    return k, 1.0 - 2.0 * NormalDist(mean, sd).cdf(k - 0.5)


def location_interval(d: Sequence[float], confidence: float) -> tuple[float, float, float, float]:
    """Hodges-Lehmann estimate of the centre of `d` with its signed-rank interval: (estimate, low, high, coverage).

    Raises ValueError when `d` is too short for `confidence` (see `min_rounds`).
    """
    n = len(d)
    if n < min_rounds(confidence):
        raise ValueError(f"{n} rounds cannot give a {confidence:.1%} interval; need at least {min_rounds(confidence)}")
    a = np.asarray(d, dtype=float)
    i, j = _pairs(n)
    walsh = np.sort((a[i] + a[j]) / 2.0)
    k, coverage = _critical(n, confidence)
    m = len(walsh)
    return float((walsh[(m - 1) // 2] + walsh[m // 2]) / 2.0), float(walsh[k - 1]), float(walsh[m - k]), coverage


@lru_cache(maxsize=512)
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The index pairs (i <= j) of the Walsh averages of n values (the paired measurement asks after every cycle)."""
    return np.triu_indices(n)


def speedup_from_log_ratios(d: Sequence[float], confidence: float) -> Speedup:
    """The speedup whose per-pair log ratios log(default / candidate) are `d`."""
    est, low, high, coverage = location_interval(d, confidence)
    return Speedup(math.exp(est), math.exp(low), math.exp(high), coverage, len(d))


def speedup_interval(default: Sequence[float], candidate: Sequence[float], confidence: float) -> Speedup:
    """The speedup of `candidate` over `default` from per-round latencies (paired by position).

    Raises ValueError when the rounds are too few for `confidence` (see `min_rounds`).
    """
    if len(default) != len(candidate):
        raise ValueError("default and candidate need one latency per round each")
    d = np.log(np.asarray(default, dtype=float)) - np.log(np.asarray(candidate, dtype=float))
    return speedup_from_log_ratios(list(d), confidence)


def pooled_speedup(measurements: Sequence[Sequence[float]], confidence: float, few: bool = False) -> Speedup:
    """One speedup from several measurements of the same two engines (each a list of per-cycle log ratios).

    Each measurement gives a Hodges-Lehmann estimate y_i with a within-measurement variance v_i read
    off its signed-rank interval at FIT_CONFIDENCE; the between-measurement variance tau^2 is the
    DerSimonian-Laird moment estimate, and the result is the inverse-variance (1 / (v_i + tau^2))
    weighted mean of the y_i with a normal interval at `confidence`. Measurements too short for a
    FIT_CONFIDENCE interval are left out; a single measurement long enough for `confidence` keeps its
    exact interval. Raises ValueError when none is long enough.

    `few`: the interval of a few measurements (the confirmation's), whose tau^2 estimate is too rough
    for a normal interval: the Hartung-Knapp variance (never below the DerSimonian-Laird one) with a
    Student t quantile on m - 1 degrees of freedom; a single measurement then gives no interval
    (ValueError).
    """
    usable = [m for m in measurements if len(m) >= min_rounds(FIT_CONFIDENCE)]
    if not usable:
        raise ValueError(
            f"no measurement has the {min_rounds(FIT_CONFIDENCE)} cycles a {FIT_CONFIDENCE:.1%} interval needs"
        )
    if few and len(usable) < 2:
        raise ValueError("one measurement cannot show how much measurements differ")
    if len(usable) == 1 and len(usable[0]) >= min_rounds(confidence):
        return speedup_from_log_ratios(usable[0], confidence)
    z_fit, z = (NormalDist().inv_cdf(0.5 + c / 2) for c in (FIT_CONFIDENCE, confidence))
    fits = [location_interval(m, FIT_CONFIDENCE) for m in usable]
    y, v = [f[0] for f in fits], [((f[2] - f[1]) / (2 * z_fit)) ** 2 for f in fits]
    est, se = random_effects(y, v)
    if few:
        se, z = (
            se * math.sqrt(max(1.0, hartung_knapp_factor(y, v))),
            student_t_quantile(0.5 + confidence / 2, len(y) - 1),
        )
    return Speedup(math.exp(est), math.exp(est - z * se), math.exp(est + z * se), confidence, sum(map(len, usable)))


def hartung_knapp_factor(estimates: Sequence[float], variances: Sequence[float]) -> float:
    """q of the Hartung-Knapp variance (q times the random-effects one): the weighted spread of the estimates
    about the pooled one over m - 1, with the DerSimonian-Laird weights."""
    y, v = np.asarray(estimates, dtype=float), np.maximum(np.asarray(variances, dtype=float), 1e-12)
    est, _ = random_effects(y, v)
    w_star = 1 / (v + between_variance(y, v))
    return float(np.sum(w_star * (y - est) ** 2) / (len(y) - 1))


def student_t_quantile(p: float, df: int) -> float:
    """The `p` quantile (p > 0.5) of Student's t with `df` degrees of freedom: bisection on its distribution
    function, integrated numerically from its density (accurate to about 1e-6 for the small df used here)."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x: float) -> float:
        grid = np.linspace(0.0, x, 4001)
        density = np.exp(log_c - (df + 1) / 2 * np.log1p(grid**2 / df))
        return 0.5 + float(np.sum(density[1:] + density[:-1])) * x / 8000  # the trapezoid rule

    low, high = 0.0, 1.0
    while cdf(high) < p:
        low, high = high, high * 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


def random_effects(estimates: Sequence[float], variances: Sequence[float]) -> tuple[float, float]:
    """(pooled estimate, its standard error): DerSimonian-Laird random-effects combination of `estimates`
    with within-study `variances` (inverse-variance weights 1 / (v_i + tau^2), tau^2 the moment estimate)."""
    y, v = np.asarray(estimates, dtype=float), np.maximum(np.asarray(variances, dtype=float), 1e-12)
    w_star = 1 / (v + between_variance(y, v))
    return float(np.sum(w_star * y) / np.sum(w_star)), math.sqrt(1 / float(np.sum(w_star)))


def between_variance(y: np.ndarray, v: np.ndarray) -> float:
    """tau^2, the DerSimonian-Laird moment estimate of the variance between measurements (0 for one)."""
    if len(y) < 2:
        return 0.0
    w = 1 / v
    q = float(np.sum(w * (y - np.sum(w * y) / np.sum(w)) ** 2))
    return max(0.0, (q - (len(y) - 1)) / float(np.sum(w) - np.sum(w**2) / np.sum(w)))


def weighted_speedup(speedups: Sequence[Speedup], weights: Sequence[float]) -> Speedup:
    """The weighted geometric mean of independent per-shape speedups, with an interval from theirs.

    With normalised weights w_i the estimate is exp(sum w_i log s_i). Each shape's interval is read as
    log s_i -/+ its own lower and upper log half-widths (l_i, u_i: about z times a standard error, the
    shapes being measured in separate ABBA series), so the combination's half-widths are
    sqrt(sum w_i^2 l_i^2) below and sqrt(sum w_i^2 u_i^2) above; the coverage is the least of the shapes'.
    """
    w = np.asarray(weights, dtype=float) / float(np.sum(weights))
    logs = np.log([s.estimate for s in speedups])
    below = logs - np.log([s.low for s in speedups])
    above = np.log([s.high for s in speedups]) - logs
    est = float(np.sum(w * logs))
    return Speedup(
        math.exp(est),
        math.exp(est - math.sqrt(float(np.sum((w * below) ** 2)))),
        math.exp(est + math.sqrt(float(np.sum((w * above) ** 2)))),
        min(s.confidence for s in speedups),
        min(s.rounds for s in speedups),
    )


def mixed_cycles(log_ratios: Sequence[Sequence[float]], weights: Sequence[float]) -> list[float]:
    """Per-shape cycles combined index by index (up to the fewest any shape ran): sum w_i d_i,j with normalised weights.

    One mixed cycle is one ABBA cycle at every shape, weighted: its log ratio estimates the log of the weighted
    geometric mean speedup, so measurements of several shapes pool (racing, confirmation) as one shape's cycles do.
    """
    w = np.asarray(weights, dtype=float) / float(np.sum(weights))
    n = min(len(d) for d in log_ratios)
    return [float(v) for v in np.sum([wi * np.asarray(d[:n], dtype=float) for wi, d in zip(w, log_ratios)], axis=0)]
