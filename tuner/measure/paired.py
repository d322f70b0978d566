"""Paired, drift-corrected timing: a candidate against the study's baseline engine, in ABBA blocks.

Both engines live in one process and are timed alternately in short *blocks* (A = baseline,
B = candidate): A B B A, A B B A, ... A block is `calls` consecutive inferences of one engine and
yields one block statistic (the study's statistic over the block's per-call samples; in pipelined
mode one sample per block: the mean per call of back-to-back calls). A *cycle* ABBA yields one log
ratio d = (log a1 + log a2 - log b1 - log b2) / 2; any drift that is linear over the cycle's few
hundred milliseconds cancels, and slower drift cancels in every cycle. The speedup (baseline /
candidate) is the Hodges-Lehmann estimate of the d's with a Wilcoxon signed-rank interval
(`tuner.measure.speedup`).

Steady state first: each engine is warmed up in blocks (block length calibrated to `block_s`)
until its last `WARMUP_WINDOW` block statistics agree within `warmup_agree` (not for a fixed time),
or its warm-up share of the cap is spent (then `steady` is False).

Adaptive stop, checked after every cycle once there are enough cycles for an interval, spending
effort only where it can change a decision:
- `slow`      the interval lies entirely below the incumbent's (its lower bound: pruning a clear loser);
- `ahead`     the interval lies entirely above the incumbent's (its upper bound): a new leader
              whatever more cycles say (racing re-measures a leader);
- `precision` the interval's relative half-width is within `target` (and `min_duration_s` spent);
- `cap`       the timing cap `cap_s` is spent (the minimum number of cycles always runs).

Contention (`tuner.measure.contention`): with a probe, every block records what other processes
took of the cores while it ran. Under `contention = "exclusive"` (the default) a cycle with a
contended block is set aside and run again: it enters no interval and stops nothing. A measurement
that gathered too few clean cycles for an interval by its cap, or had CONTENDED_GIVE_UP times that
many set aside first, is flagged `contended` and stops (its figures then come from every cycle). Under "shared"
(the deployment runs beside other work) contention is recorded only.
Without a baseline the same loop runs on the candidate alone (unpaired): the interval is then
that of its block-statistic level, and there is no speedup.

Drift: when either engine's level moved by more than `drift` between the two halves of the
measurement, or the device clocks read before and after differ by more than `drift`, the
measurement is repeated once (with a fresh cap) and the repeat is kept; if it drifts too it is
flagged (`drift` True). Every attempt is summarised in `attempts`.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tuner.measure.contention import Load, Probe, summarize
from tuner.measure.speedup import Speedup, location_interval, min_rounds, speedup_from_log_ratios

BlockFn = Callable[[int], list[float]]  # run n inferences; per-call latencies in ms (pipelined: [mean ms per call])
Clocks = Callable[[], Mapping[str, Any]]

PRECISION, CAP, SLOW, AHEAD = "precision", "cap", "slow", "ahead"
PER_CALL, PIPELINED = "per-call", "pipelined"
MODES = (PER_CALL, PIPELINED)
EXCLUSIVE, SHARED = "exclusive", "shared"  # [objective] contention: act on contended cycles, or only record them
CONTENTION = (EXCLUSIVE, SHARED)
WARMUP_WINDOW = 3
CONTENDED_GIVE_UP = (
    3  # set-aside cycles, in units of the fewest an interval needs, after which a contended measurement stops
)
WARMUP_SHARE = 0.25  # an engine's warm-up may use at most this share of the cap
CLOCK_KEYS = ("sm_clock_mhz", "mem_clock_mhz")


@dataclass(frozen=True)
class PairedPolicy:
    """How a paired measurement runs and when it stops (from the study file's [objective])."""

    statistic: str = "median"
    mode: str = PER_CALL
    confidence: float = 0.95
    target: float = 0.02  # stop when the speedup interval's relative half-width is within this
    min_duration_s: float = 0.5  # measure at least this long after warm-up ...
    min_calls: int = 1  # ... and at least this many calls of the candidate
    cap_s: float = 10.0  # ... and at most this long (warm-up included), beyond the minimum cycles
    block_s: float = 0.05  # a block lasts about this long
    min_block_calls: int = 1
    warmup_min_s: float = 0.2  # warm up at least this long per engine ...
    warmup_agree: float = 0.05  # ... and until the last blocks' statistics agree within this
    drift: float = 0.10  # relative level or clock change that counts as drift
    contention: str = EXCLUSIVE  # SHARED: contended cycles are recorded but kept


@dataclass
class Warmup:
    """How an engine was brought to steady state."""

    calls: int  # calls per block from here on
    steady: bool
    seconds: float
    blocks: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {"calls": self.calls, "steady": self.steady, "seconds": round(self.seconds, 4), "blocks": self.blocks}


@dataclass
class PairedResult:
    """One paired (or unpaired) measurement."""

    paired: bool
    stop: str
    cycles: int
    seconds: float  # measuring time of the kept attempt (warm-up excluded)
    candidate_samples: list[float]
    baseline_samples: list[float]
    candidate_blocks: list[float]
    baseline_blocks: list[float]
    log_ratios: list[float]
    speedup: Speedup | None  # baseline / candidate with its interval (paired only)
    level_ms: tuple[float, float, float]  # the candidate's block-level estimate with its interval (ms)
    halfwidth: float
    drift: bool
    repeated: bool
    steady: bool
    warmup: dict[str, Any] = field(default_factory=dict)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    running: list[list[float]] = field(default_factory=list)  # [cycle, estimate, low, high] after each judged cycle
    clocks: list[dict[str, Any]] = field(default_factory=list)  # device clocks before and after each attempt
    contended: bool = False  # too few uncontended cycles for an interval: the figures come from contended ones
    contended_cycles: int = 0  # cycles set aside because other work took a core during one of their blocks
    contention: dict[str, Any] = field(default_factory=dict)  # `tuner.measure.contention.summarize` of every block

    def summary(self) -> dict[str, Any]:
        """The small JSON-able description kept with the trial (no raw samples)."""
        out: dict[str, Any] = {
            "paired": self.paired,
            "stop": self.stop,
            "cycles": self.cycles,
            "seconds": round(self.seconds, 4),
            "halfwidth": round(self.halfwidth, 5),
            "drift": self.drift,
            "repeated": self.repeated,
            "steady": self.steady,
            "level_ms": [round(v, 6) for v in self.level_ms],
            "warmup": self.warmup,
            "attempts": self.attempts,
            "contended": self.contended,
            "contended_cycles": self.contended_cycles,
            "contention": self.contention,
        }
        if self.speedup is not None:
            out.update(
                speedup=self.speedup.estimate,
                ci=[self.speedup.low, self.speedup.high],
                confidence=self.speedup.confidence,
            )
        return out


def block_statistic(samples: list[float], statistic: str) -> float:
    """The study's latency statistic over one block's samples."""
    if statistic == "mean":
        return float(np.mean(samples))
    if statistic == "min":
        return float(np.min(samples))
    if statistic in ("p90", "p99"):
        return float(np.percentile(samples, 90 if statistic == "p90" else 99))
    return float(np.median(samples))


def _calls_for(per_call_ms: float, policy: PairedPolicy) -> int:
    return max(policy.min_block_calls, math.ceil(policy.block_s * 1000.0 / max(per_call_ms, 1e-6)))


def warm_up(fn: BlockFn, policy: PairedPolicy, clock: Callable[[], float] = time.perf_counter) -> Warmup:
    """Run blocks until the last WARMUP_WINDOW block statistics agree (and warmup_min_s passed) or the warm-up share of
    the cap is spent."""
    start = clock()
    calls = _calls_for(block_statistic(fn(1), policy.statistic), policy)
    window: list[float] = []
    blocks = 0
    steady = False
    while True:
        window = (window + [block_statistic(fn(calls), policy.statistic)])[-WARMUP_WINDOW:]
        blocks += 1
        elapsed = clock() - start
        if (
            len(window) == WARMUP_WINDOW
            and max(window) <= min(window) * (1.0 + policy.warmup_agree)
            and elapsed >= policy.warmup_min_s
        ):
            steady = True
            break
        if elapsed >= policy.cap_s * WARMUP_SHARE:
            break
    return Warmup(_calls_for(statistics.median(window), policy), steady, clock() - start, blocks)


def level_drift(blocks: list[float], threshold: float) -> bool:
    """Whether the median level of the second half of `blocks` differs from the first half's by more than
    `threshold`."""
    half = len(blocks) // 2
    if half < 2:
        return False
    first, second = statistics.median(blocks[:half]), statistics.median(blocks[half:])
    return abs(math.log(second / first)) > math.log1p(threshold)


def clocks_drift(before: Mapping[str, Any], after: Mapping[str, Any], threshold: float) -> bool:
    """Whether an SM or memory clock read before and after a measurement differs by more than `threshold`."""
    for key in CLOCK_KEYS:
        a, b = before.get(key), after.get(key)
        if isinstance(a, int | float) and isinstance(b, int | float) and a > 0 and abs(b - a) / a > threshold:
            return True
    return False


def _halfwidth(low: float, high: float) -> float:
    return math.sqrt(high / low) - 1.0 if low > 0 else math.inf


def _attempt(
    candidate: BlockFn,
    baseline: BlockFn | None,
    calls: tuple[int, int],
    policy: PairedPolicy,
    incumbent: tuple[float | None, float | None],
    clock: Callable[[], float],
    probe: Probe | None,
) -> PairedResult:
    """One measurement: cycles until a stopping rule holds (`incumbent`: its interval's low and high, either may be
    None)."""
    need = min_rounds(policy.confidence)
    stat = policy.statistic
    cand_samples: list[float] = []
    base_samples: list[float] = []
    cand_blocks: list[float] = []
    base_blocks: list[float] = []
    d: list[float] = []
    set_aside: list[float] = []  # cycles with a contended block
    loads: list[Load | None] = []
    running: list[list[float]] = []
    start = clock()
    calls_done = 0

    def block(fn: BlockFn, n: int, samples: list[float], blocks: list[float]) -> float:
        nonlocal calls_done
        calls_done += n if fn is candidate else 0
        before = probe.snapshot() if probe else None
        got = fn(n)
        loads.append(probe.since(before) if probe else None)
        samples.extend(got)
        blocks.append(block_statistic(got, stat))
        return blocks[-1]

    while True:
        if baseline is None:
            ratio = math.log(block(candidate, calls[0], cand_samples, cand_blocks))
        else:
            a1 = block(baseline, calls[1], base_samples, base_blocks)
            b1 = block(candidate, calls[0], cand_samples, cand_blocks)
            b2 = block(candidate, calls[0], cand_samples, cand_blocks)
            a2 = block(baseline, calls[1], base_samples, base_blocks)
            ratio = (math.log(a1) + math.log(a2) - math.log(b1) - math.log(b2)) / 2.0
        contended = policy.contention == EXCLUSIVE and any(
            x is not None and x.contended for x in loads[-(1 if baseline is None else 4) :]
        )
        (set_aside if contended else d).append(ratio)
        elapsed = clock() - start
        over = (
            elapsed >= policy.cap_s or len(d) < need and len(set_aside) >= CONTENDED_GIVE_UP * need
        )  # hopeless: stop early
        stuck = len(d) < need  # too few clean cycles: go on, and at the cap judge every cycle (flagged)
        if stuck and (not over or len(d) + len(set_aside) < need) or contended and not over:
            continue
        kept = d + set_aside if stuck else d
        speedup: Speedup | None = None
        if baseline is None:
            est, low, high, _ = location_interval(kept, policy.confidence)
            halfwidth = _halfwidth(math.exp(low), math.exp(high))
        else:
            speedup = speedup_from_log_ratios(kept, policy.confidence)
            halfwidth = speedup.halfwidth
            running.append([len(kept), speedup.estimate, speedup.low, speedup.high])
        stop = ""
        if stuck:
            stop = CAP
        elif speedup is not None and incumbent[0] is not None and speedup.high < incumbent[0]:
            stop = SLOW
        elif speedup is not None and incumbent[1] is not None and speedup.low > incumbent[1]:
            stop = AHEAD
        elif halfwidth <= policy.target and elapsed >= policy.min_duration_s and calls_done >= policy.min_calls:
            stop = PRECISION
        elif elapsed >= policy.cap_s:
            stop = CAP
        if stop:
            break
    level = location_interval([math.log(b) for b in cand_blocks], policy.confidence)
    return PairedResult(
        paired=baseline is not None,
        stop=stop,
        cycles=len(kept),
        seconds=clock() - start,
        candidate_samples=cand_samples,
        baseline_samples=base_samples,
        candidate_blocks=cand_blocks,
        baseline_blocks=base_blocks,
        log_ratios=kept,
        speedup=speedup,
        level_ms=(math.exp(level[0]), math.exp(level[1]), math.exp(level[2])),
        halfwidth=halfwidth,
        drift=False,
        repeated=False,
        steady=True,
        running=running,
        contended=stuck,
        contended_cycles=len(set_aside),
        contention=summarize(loads) if probe else {},
    )


def _drifted(r: PairedResult, policy: PairedPolicy) -> bool:
    if level_drift(r.candidate_blocks, policy.drift) or (r.paired and level_drift(r.baseline_blocks, policy.drift)):
        return True
    return len(r.clocks) == 2 and clocks_drift(r.clocks[0], r.clocks[1], policy.drift)


def measure_paired(
    candidate: BlockFn,
    baseline: BlockFn | None,
    policy: PairedPolicy,
    incumbent: float | None = None,
    clocks: Clocks | None = None,
    clock: Callable[[], float] = time.perf_counter,
    incumbent_high: float | None = None,
    probe: Probe | None = None,
) -> PairedResult:
    """Warm up both engines, measure in ABBA cycles until a stopping rule holds, repeat once on drift.

    `incumbent` is the speedup a candidate must be able to reach (the lower bound of the best
    interval so far; 1.0 is the default route itself): an interval entirely below it stops the
    measurement as `slow`; one entirely above `incumbent_high` (that interval's upper bound) as `ahead`.
    `clocks` reads the device clocks (called before and after each attempt); `probe` reads what
    other work took of the cores during each block (`tuner.measure.contention`).
    """
    warm = {"candidate": warm_up(candidate, policy, clock)}
    if baseline is not None:
        warm["baseline"] = warm_up(baseline, policy, clock)
    calls = (warm["candidate"].calls, warm["baseline"].calls if baseline is not None else 0)
    result: PairedResult | None = None
    attempts: list[dict[str, Any]] = []
    for _ in range(2):
        before = dict(clocks()) if clocks else {}
        result = _attempt(candidate, baseline, calls, policy, (incumbent, incumbent_high), clock, probe)
        if clocks:
            result.clocks = [before, dict(clocks())]
        result.drift = _drifted(result, policy)
        attempts.append(
            {
                "stop": result.stop,
                "cycles": result.cycles,
                "seconds": round(result.seconds, 4),
                "drift": result.drift,
                **({"speedup": result.speedup.estimate} if result.speedup else {"level_ms": result.level_ms[0]}),
            }
        )
        if not result.drift or result.stop == SLOW:
            break
    assert result is not None
    result.repeated = len(attempts) > 1
    result.attempts = attempts
    result.warmup = {k: w.to_dict() for k, w in warm.items()}
    result.steady = all(w.steady for w in warm.values())
    return result
