"""A candidate's speedup over the default route, with an exact distribution-free confidence interval.

Method (used by `tuner.study.confirm`): the default route and each candidate are timed once per
*round*, each in a fresh process, in an order that rotates from round to round. A round yields one
latency statistic (the median) per route; the per-round log ratio d = log(default / candidate) pairs
the two routes under the same machine conditions, so slow drift (thermal state, a noisy neighbour,
clock changes) cancels. The speedup is exp of the Hodges-Lehmann estimate of the d's (the median of
their Walsh averages) and its interval is the matching Wilcoxon signed-rank interval, computed from
the exact null distribution. That interval assumes only that the rounds are independent and the
d's symmetric about their centre: no normality, and one disturbed round cannot drag the estimate
(with few rounds a t-interval would need normality and a bootstrap under-covers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Speedup:
    """A speedup factor (default latency / candidate latency) with its confidence interval."""

    estimate: float
    low: float
    high: float
    confidence: float  # the interval's exact coverage (>= the level asked for)
    rounds: int

    @property
    def significant(self) -> bool:
        """The candidate is faster than the default at this confidence (the interval excludes 1.0)."""
        return self.low > 1.0

    @property
    def slower(self) -> bool:
        """The candidate is slower than the default at this confidence."""
        return self.high < 1.0

    def to_dict(self) -> dict[str, float | int]:
        """JSON-able form."""
        return {"speedup": self.estimate, "low": self.low, "high": self.high, "confidence": self.confidence, "rounds": self.rounds}


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
    """The fewest rounds whose widest signed-rank interval reaches `confidence` (two-sided)."""
    n = 1
    while 2.0 / 2**n > 1.0 - confidence:
        n += 1
    return n


def speedup_interval(default: Sequence[float], candidate: Sequence[float], confidence: float) -> Speedup:
    """The speedup of `candidate` over `default` from per-round latencies (paired by position).

    Raises ValueError when the rounds are too few for `confidence` (see `min_rounds`).
    """
    if len(default) != len(candidate):
        raise ValueError("default and candidate need one latency per round each")
    n = len(default)
    if n < min_rounds(confidence):
        raise ValueError(f"{n} rounds cannot give a {confidence:.1%} interval; need at least {min_rounds(confidence)}")
    d = np.log(np.asarray(default, dtype=float)) - np.log(np.asarray(candidate, dtype=float))
    i, j = np.triu_indices(n)
    walsh = np.sort((d[i] + d[j]) / 2.0)
    counts = signed_rank_counts(n)
    total = 2**n
    alpha = 1.0 - confidence
    # Largest k with P(T <= k-1) <= alpha/2; the interval is [w_k, w_{M+1-k}] (1-based).
    k, tail = 0, 0
    while (tail + counts[k]) / total <= alpha / 2:
        tail += counts[k]
        k += 1
    low, high = walsh[k - 1], walsh[len(walsh) - k]
    return Speedup(math.exp(float(np.median(walsh))), math.exp(float(low)), math.exp(float(high)), 1.0 - 2.0 * tail / total, n)
