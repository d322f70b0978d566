"""Our measurement, replayed: paired trial timing with adaptive stopping, racing of close leaders, early pruning.

The rules mirror `tuner.measure.paired`: a trial times the candidate and the study's
baseline alternately in one process, in ABBA cycles of blocks lasting about `block_s` each; a cycle
gives one log ratio (the mean of its two candidate blocks' log medians minus its two baseline
blocks'). After at least `min_cycles` cycles it stops as soon as one holds: `slow` (the interval lies
entirely on the slower side of the incumbent's estimate: early pruning), `precision` (the 95 %
interval's half-width is within `half_width`, ±2 %, and `min_duration_s` spent) or `cap` (`cap_s` of
timing spent). Racing follows `tuner.study.racing`: after every trial, the leader (if never
re-measured) and the leaders among the top 3 whose intervals overlap its interval are re-measured,
at most twice each; all of a route's cycles are pooled into one interval; a route is *confirmed*
once re-measured with its pooled interval entirely faster than the default, and the study delivers
its fastest confirmed route, else the default. A new trial is pruned as `slow` when its interval
lies entirely slower than the best lower speedup bound so far (at least the default's).
Simplifications: a t interval on the cycles' mean stands in for the Hodges-Lehmann/Wilcoxon one,
warm-up and the drift-triggered repeat are not replayed (the noise below has no within-measurement
trend), and time is counted from the routes' true latencies.

The noise comes from the landscape's own recordings, per route:
- *within a measurement*: each timed call's relative residual, drawn from the route's recorded
  per-call samples divided by their round's median (the per-call noise a block sees);
- *between measurements*: the route's recorded round medians relative to its true value (how far a
  whole measurement moved with the machine's state). Pairing cancels the part of that drift the two
  engines share; `PairedPolicy.leak` is the share that survives it (0: ideal pairing; 1: no better
  than two separate measurements). The recordings cannot tell how much is shared (their rounds were
  not taken side by side), so the benchmark reports several values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from bench.landscape.oracle import Oracle
from tuner import job as J
from tuner.measure.speedup import random_effects

PRECISION, CAP, SLOW = "precision", "cap", "slow"  # what stopped a measurement
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int | np.ndarray) -> np.ndarray:
    """Student's t 97.5 % quantile for `df` degrees of freedom (table to 30, then 1.96 + 2.4/df)."""
    d = np.asarray(df, dtype=int)
    table = np.asarray(T975)
    return np.where(d <= len(T975), table[np.clip(d, 1, len(T975)) - 1], 1.96 + 2.4 / np.maximum(d, 1))


@dataclass(frozen=True)
class PairedPolicy:
    """How one paired measurement and the racing run (tuner.measure.paired's and tuner.study.racing's defaults)."""

    half_width: float = 0.02  # stop when the ratio's 95 % interval is within ±2 % ...
    min_duration_s: float = 0.5  # ... and at least this long was measured
    cap_s: float = 10.0  # timing cap per measurement (seconds of timed calls, both engines)
    block_s: float = 0.05  # a block lasts about this long (at least one call)
    min_cycles: int = 6  # ABBA cycles before any stopping rule applies (an exact 95 % Wilcoxon interval needs 6)
    min_calls: int = 20  # precision also needs this many calls of the candidate (the study's min_repeats)
    max_cycles: int = 2000
    leak: float = 0.1  # share of the recorded between-round drift that pairing does not cancel
    race_top: int = 3  # leaders considered for racing
    remeasure_max: int = 2  # re-measurements of one route while racing
    prune: bool = True  # stop a candidate early once it is clearly slower than the incumbent

    def label(self) -> str:
        """A short description for reports."""
        return (f"paired ABBA, ±{self.half_width:.0%} target, cap {self.cap_s:g} s, drift leak {self.leak:g}, "
                f"racing the top {self.race_top} (≤ {self.remeasure_max} re-measurements each)"
                + (", early pruning" if self.prune else ", no pruning"))


@dataclass(frozen=True)
class Paired:
    """One paired measurement: log(candidate / baseline) with its 95 % half-width (in log units)."""

    log_ratio: float
    half_width: float
    cycles: int
    stopped: str
    seconds: float
    running: tuple[tuple[int, float, float, float], ...] = ()  # (cycle, speedup, low, high) after each judged cycle

    @property
    def low(self) -> float:
        return self.log_ratio - self.half_width

    @property
    def high(self) -> float:
        return self.log_ratio + self.half_width


@dataclass(frozen=True)
class RouteNoise:
    """A route's recorded noise: per-call log residuals and per-round log drift; its true value."""

    true_ms: float
    residuals: np.ndarray
    drifts: np.ndarray


@dataclass
class PairedMeter:
    """Paired measurements of landscape routes against one baseline route, with the recorded noise."""

    oracle: Oracle
    policy: PairedPolicy
    rng: np.random.Generator

    @cached_property
    def noise(self) -> dict[str, RouteNoise]:
        return route_noise(self.oracle)

    def measure(self, key: str, baseline: str, slow_above: float | None = None) -> Paired:
        """Measure route `key` against `baseline`; with `slow_above` (a log ratio: the incumbent's
        estimate), stop early as "slow" once the interval's lower end is above it."""
        p = self.policy
        c, b = self.noise[key], self.noise[baseline]
        calls_c, calls_b = (max(1, math.ceil(p.block_s * 1000.0 / r.true_ms)) for r in (c, b))
        cycle_s = 2.0 * (calls_c * c.true_ms + calls_b * b.true_ms) / 1000.0
        n_max = int(min(p.max_cycles, max(p.min_cycles, math.ceil(p.cap_s / cycle_s))))
        drift = p.leak * (self.rng.choice(c.drifts) - self.rng.choice(b.drifts)) if key != baseline else 0.0
        mu = math.log(c.true_ms / b.true_ms) + drift
        cycles = mu + (_block_logs(c.residuals, calls_c, n_max, self.rng) - _block_logs(b.residuals, calls_b, n_max, self.rng))
        n = np.arange(1, n_max + 1)
        mean = np.cumsum(cycles) / n
        var = np.maximum(np.cumsum(cycles**2) / n - mean**2, 0.0) * n / np.maximum(n - 1, 1)
        hw = t975(n - 1) * np.sqrt(var / n)
        eligible = n >= p.min_cycles
        done = eligible & (hw <= math.log1p(p.half_width)) & (n * cycle_s >= p.min_duration_s) & (2 * n * calls_c >= p.min_calls)
        slow = eligible & (mean - hw > slow_above) if slow_above is not None else np.zeros(n_max, bool)
        stop = np.flatnonzero(done | slow)
        i = int(stop[0]) if stop.size else n_max - 1
        why = SLOW if slow[i] else PRECISION if done[i] else CAP
        running = tuple((j + 1, math.exp(-mean[j]), math.exp(-mean[j] - hw[j]), math.exp(-mean[j] + hw[j])) for j in range(p.min_cycles - 1, i + 1))
        return Paired(float(mean[i]), float(hw[i]), i + 1, why, (i + 1) * cycle_s, running)


def _block_logs(residuals: np.ndarray, calls: int, cycles: int, rng: np.random.Generator) -> np.ndarray:
    """Per cycle, the mean of two blocks' log medians (relative to the route's level)."""
    return np.median(rng.choice(residuals, size=(cycles, 2, calls), replace=True), axis=2).mean(axis=1)


def route_noise(oracle: Oracle) -> dict[str, RouteNoise]:
    """Every timed route's recorded noise (routes with no timed round are absent)."""
    out: dict[str, RouteNoise] = {}
    for p in oracle.landscape.points:
        rounds = [np.asarray(r.samples_ms, dtype=float) for r in p.rounds if r.status == J.OK and r.timed]
        true = oracle.true_value(p)
        if not rounds or true is None:
            continue
        medians = np.array([np.median(r) for r in rounds])
        residuals = np.concatenate([np.log(r / m) for r, m in zip(rounds, medians)])
        out[p.key] = RouteNoise(true, residuals, np.log(medians / np.median(medians)))
    return out


# -- racing --------------------------------------------------------------------------------------


@dataclass
class Candidate:
    """A feasible route's paired measurements against the baseline (the trial's, then re-measurements)."""

    key: str
    measurements: list[Paired] = field(default_factory=list)

    @property
    def remeasured(self) -> int:
        return len(self.measurements) - 1

    def pooled(self) -> tuple[float, float]:
        """(log ratio, 95 % half-width) of its measurements combined with random effects, as `racing.refine` pools them."""
        if len(self.measurements) == 1:
            return self.measurements[0].log_ratio, self.measurements[0].half_width
        est, se = random_effects([m.log_ratio for m in self.measurements],
                                 [(m.half_width / t975(m.cycles - 1)) ** 2 for m in self.measurements])
        return est, 1.96 * se


@dataclass
class Race:
    """The study's feasible paired routes, raced: which route the study would deliver now."""

    meter: PairedMeter
    baseline: str
    candidates: dict[str, Candidate] = field(default_factory=dict)
    remeasures: int = 0
    seconds: float = 0.0

    def ranking(self) -> list[tuple[float, float, str]]:
        """(log-ratio estimate, half-width, key) of every candidate, fastest first."""
        return sorted((*c.pooled(), k) for k, c in self.candidates.items())

    def slow_above(self) -> float:
        """The pruning threshold (a log ratio): the best upper bound so far, at most the default's 0."""
        return min([0.0] + [est + hw for est, hw, _ in self.ranking()])

    def measure(self, key: str) -> Paired:
        """A trial's measurement of `key` (pruned early once clearly slower than the incumbent)."""
        m = self.meter.measure(key, self.baseline, self.slow_above() if self.meter.policy.prune else None)
        self.seconds += m.seconds
        return m

    def add(self, key: str, m: Paired) -> None:
        """A feasible trial measured in full joins the race."""
        if m.stopped != SLOW:
            self.candidates.setdefault(key, Candidate(key)).measurements.append(m)

    def to_race(self) -> list[str]:
        """`racing.to_race`: the leader if never re-measured or if any of the top `race_top` overlaps
        it, and those overlapping ones, each while it has fewer than `remeasure_max` re-measurements."""
        ranked = self.ranking()
        if not ranked:
            return []
        (est, hw, leader), rest = ranked[0], ranked[1 : self.meter.policy.race_top]
        close = [k for e, h, k in rest if e - h <= est + hw and e + h >= est - hw]
        picked = [leader] if close or self.candidates[leader].remeasured == 0 else []
        return [k for k in picked + close if self.candidates[k].remeasured < self.meter.policy.remeasure_max]

    def race(self) -> None:
        """One racing pass, as a worker makes after each trial."""
        for key in self.to_race():
            m = self.meter.measure(key, self.baseline)
            self.candidates[key].measurements.append(m)
            self.remeasures += 1
            self.seconds += m.seconds

    @property
    def delivered(self) -> str:
        """`racing.best_confirmed`: the fastest route re-measured at least once whose pooled interval is
        entirely faster than the default; the default when there is none."""
        confirmed = [k for est, hw, k in self.ranking() if self.candidates[k].remeasured >= 1 and est + hw < 0.0]
        return confirmed[0] if confirmed else self.baseline
