"""Latency methodology: warm-up, then repetitions until a minimum count *and* a minimum duration.

Backend-neutral: it takes a callable that performs one timed inference and returns seconds (host
clock on the CPU, CUDA events on a GPU) and reports robust statistics in milliseconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class TimingPolicy:
    """How long and how often to measure."""

    warmup_s: float = 0.2
    min_repeats: int = 20
    min_duration_s: float = 1.0
    max_repeats: int = 100_000


@dataclass(frozen=True)
class LatencyStats:
    """Latency statistics in milliseconds."""

    median: float
    mean: float
    p90: float
    p99: float
    min: float
    max: float
    cv: float  # coefficient of variation: std / mean
    count: int

    def to_dict(self) -> dict[str, float]:
        """Plain dict for JSON and trial attributes."""
        return asdict(self)

    def get(self, statistic: str) -> float:
        """One statistic by name (median, mean, p90, p99, min)."""
        return float(getattr(self, statistic))


STATISTICS = ("median", "mean", "p90", "p99", "min")


KEPT_DECIMALS = 6  # 1 ns in ms: the host clock's resolution; the digits beyond are float noise


def kept_samples(samples_ms: Sequence[float]) -> list[float]:
    """Samples as they are kept (result, measurement rows): in ms, rounded to 1 ns.

    A per-call sample is a difference of two `perf_counter` readings in seconds times 1000, so
    0.046679 ms comes out as 0.04667899997912173; rounded it is exact again and a third as long in
    JSON (a model that runs in microseconds gives tens of thousands of samples per trial).
    """
    return np.round(np.asarray(samples_ms, dtype=np.float64), KEPT_DECIMALS).tolist()


def summarize(samples_ms: Sequence[float]) -> LatencyStats:
    """Statistics of latency samples in milliseconds."""
    a = np.asarray(samples_ms, dtype=np.float64)
    mean = float(a.mean())
    return LatencyStats(
        median=float(np.median(a)),
        mean=mean,
        p90=float(np.percentile(a, 90)),
        p99=float(np.percentile(a, 99)),
        min=float(a.min()),
        max=float(a.max()),
        cv=float(a.std() / mean) if mean > 0 else 0.0,
        count=int(a.size),
    )


def measure(once: Callable[[], float], policy: TimingPolicy) -> list[float]:
    """Warm up, then time `once` until both `min_repeats` and `min_duration_s` are reached.

    Returns the samples in milliseconds. The warm-up runs at least once whatever its duration.
    """
    start = time.perf_counter()
    once()
    while time.perf_counter() - start < policy.warmup_s:
        once()
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < policy.max_repeats and (
        len(samples) < policy.min_repeats or time.perf_counter() - start < policy.min_duration_s
    ):
        samples.append(once() * 1000.0)
    return samples
