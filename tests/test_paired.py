"""The paired estimator and its stopping rules on simulated engines with a simulated clock (deterministic)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

import numpy as np
import pytest

from tuner.backends.base import Runner
from tuner.measure import paired as P
from tuner.measure.speedup import _critical, pooled_speedup, signed_rank_counts, speedup_from_log_ratios
from tuner.worker.timing import block_fn


class SimClock:
    """Simulated time: advances only when a simulated engine runs."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def engine(
    clock: SimClock,
    ms: float,
    noise: float = 0.0,
    seed: int = 0,
    level: Callable[[float], float] = lambda t: 1.0,
    cold_calls: int = 0,
) -> P.BlockFn:
    """A simulated engine: `ms` per call times the machine level at that moment, log-normal noise, a cold start decaying
    over `cold_calls`."""
    rng = np.random.default_rng(seed)
    state = {"calls": 0}

    def run(n: int) -> list[float]:
        out = []
        for _ in range(n):
            cold = 1.0 + 2.0 * math.exp(-state["calls"] / cold_calls) if cold_calls else 1.0
            state["calls"] += 1
            v = (
                ms * level(clock.now) * cold * math.exp(rng.normal(0.0, noise))
                if noise
                else ms * level(clock.now) * cold
            )
            clock.now += v / 1000.0
            out.append(v)
        return out

    return run


POLICY = P.PairedPolicy(block_s=0.02, min_duration_s=0.2, cap_s=5.0, warmup_min_s=0.05)


def test_pairing_cancels_a_two_level_machine_drift() -> None:
    """The machine jumps between two speeds every 0.7 s (as on the H200); the paired ratio stays at the true 2.0x."""
    clock = SimClock()
    level = lambda t: 1.7 if int(t / 0.7) % 2 else 1.0  # noqa: E731
    base = engine(clock, 2.0, 0.05, 1, level)
    cand = engine(clock, 1.0, 0.05, 2, level)
    r = P.measure_paired(
        cand, base, P.PairedPolicy(block_s=0.02, min_duration_s=2.0, cap_s=5.0, warmup_min_s=0.05), clock=clock
    )
    assert r.paired and r.stop == P.PRECISION and r.speedup is not None
    assert r.speedup.low <= 2.0 <= r.speedup.high and abs(r.speedup.estimate / 2.0 - 1) < 0.02
    assert r.speedup.halfwidth <= POLICY.target and r.cycles >= 6
    # The absolute levels did move: an unpaired comparison of blocks taken at different moments is not 2.0x.
    assert max(r.baseline_blocks) / min(r.baseline_blocks) > 1.5
    assert len(r.running) == r.cycles - 5 and r.running[-1][1] == r.speedup.estimate


def test_noise_too_large_for_the_target_stops_at_the_cap_and_says_so() -> None:
    clock = SimClock()
    r = P.measure_paired(
        engine(clock, 1.0, 0.6, 3),
        engine(clock, 1.0, 0.6, 4),
        P.PairedPolicy(block_s=0.001, cap_s=0.5, warmup_min_s=0.0),
        clock=clock,
    )
    assert r.stop == P.CAP and r.speedup is not None and r.speedup.halfwidth > 0.02
    assert r.speedup.low < 1.0 < r.speedup.high


def test_a_clearly_slower_candidate_is_stopped_as_slow_after_the_minimum_cycles() -> None:
    clock = SimClock()
    r = P.measure_paired(engine(clock, 3.0, 0.02, 5), engine(clock, 2.0, 0.02, 6), POLICY, incumbent=1.0, clock=clock)
    assert r.stop == P.SLOW and r.cycles == 6 and r.speedup is not None and r.speedup.high < 1.0
    assert abs(r.speedup.estimate - 2.0 / 3.0) < 0.02


def test_a_candidate_faster_than_the_default_but_slower_than_the_incumbent_is_slow() -> None:
    clock = SimClock()
    r = P.measure_paired(engine(clock, 1.6, 0.02, 7), engine(clock, 2.0, 0.02, 8), POLICY, incumbent=1.5, clock=clock)
    assert r.stop == P.SLOW and r.speedup is not None and 1.0 < r.speedup.estimate < 1.5
    r = P.measure_paired(engine(clock, 1.6, 0.02, 7), engine(clock, 2.0, 0.02, 8), POLICY, incumbent=1.1, clock=clock)
    assert r.stop == P.PRECISION


def test_warm_up_waits_for_agreeing_blocks_not_for_a_fixed_time() -> None:
    clock = SimClock()
    w = P.warm_up(engine(clock, 1.0, cold_calls=50), P.PairedPolicy(block_s=0.01, warmup_min_s=0.0), clock)
    assert w.steady and 8 <= w.calls <= 10  # recalibrated to the warm per-call time
    assert w.blocks > 10  # the cold start (3 ms per call decaying to 1 ms) had to fade before three blocks agreed
    clock = SimClock()
    flip = engine(clock, 1.0, level=lambda t: 1.0 + 0.5 * (int(t / 0.01) % 2))
    w = P.warm_up(flip, P.PairedPolicy(block_s=0.01, warmup_min_s=0.0, cap_s=2.0), clock)
    assert not w.steady and 0.5 <= w.seconds < 0.6  # gave up after its share (25 %) of the cap


def test_a_drifting_measurement_is_repeated_and_the_steady_repeat_kept() -> None:
    clock = SimClock()
    step = lambda t: 1.0 if t < 1.0 else 1.6  # noqa: E731 - the machine slows down once, during the first attempt
    policy = P.PairedPolicy(block_s=0.02, min_duration_s=1.5, cap_s=4.0, warmup_min_s=0.05)
    r = P.measure_paired(engine(clock, 1.0, 0.01, 9, step), engine(clock, 1.2, 0.01, 10, step), policy, clock=clock)
    assert r.repeated and not r.drift and len(r.attempts) == 2 and r.attempts[0]["drift"]
    assert r.speedup is not None and abs(r.speedup.estimate - 1.2) < 0.02


def test_clocks_that_change_during_both_attempts_are_flagged() -> None:
    clock = SimClock()
    reads = iter([{"sm_clock_mhz": 1980}, {"sm_clock_mhz": 1400}, {"sm_clock_mhz": 1980}, {"sm_clock_mhz": 1500}])
    r = P.measure_paired(
        engine(clock, 1.0, 0.01, 11), engine(clock, 1.0, 0.01, 12), POLICY, clocks=lambda: next(reads), clock=clock
    )
    assert r.repeated and r.drift and r.clocks == [{"sm_clock_mhz": 1980}, {"sm_clock_mhz": 1500}]
    assert not P.clocks_drift(
        {"sm_clock_mhz": 1980, "mem_clock_mhz": 2619}, {"sm_clock_mhz": 1965, "mem_clock_mhz": 2619}, 0.1
    )


def test_unpaired_measurement_gives_a_level_and_no_speedup() -> None:
    clock = SimClock()
    r = P.measure_paired(engine(clock, 4.0, 0.02, 13), None, POLICY, clock=clock)
    assert not r.paired and r.speedup is None and r.baseline_samples == []
    assert r.level_ms[1] <= 4.0 <= r.level_ms[2] * 1.02 and r.stop == P.PRECISION
    assert "speedup" not in r.summary() and r.summary()["level_ms"][0] == pytest.approx(4.0, rel=0.02)


def test_pipelined_blocks_are_one_mean_per_block() -> None:
    assert P.block_statistic([2.0], "median") == 2.0
    assert P.block_statistic([1.0, 2.0, 9.0], "median") == 2.0 and P.block_statistic([1.0, 2.0, 9.0], "mean") == 4.0
    assert P.block_statistic([1.0, 2.0, 9.0], "min") == 1.0


def test_normal_approximation_continues_the_exact_interval() -> None:
    """Beyond EXACT_MAX pairs the critical rank comes from the normal approximation; at the seam both agree."""
    k_exact, cov_exact = _critical(30, 0.95)
    counts = signed_rank_counts(30)
    assert sum(counts[:k_exact]) / 2**30 <= 0.025 < sum(counts[: k_exact + 1]) / 2**30
    k_approx, cov_approx = _critical(31, 0.95)
    assert abs(k_approx - k_exact) <= 12 and 0.94 <= cov_approx <= 0.96 and cov_exact >= 0.95
    d = list(np.log(1.25) + np.random.default_rng(14).normal(0, 0.01, 200))
    s = speedup_from_log_ratios(d, 0.95)
    assert s.low < 1.25 < s.high and s.halfwidth < 0.005


class CountingRunner(Runner):
    """A real runner doing a little numpy work per call and counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        return {"y": feed["x"] @ feed["x"]}


def test_per_call_blocks_time_each_call_and_pipelined_blocks_one_run_of_back_to_back_calls() -> None:
    feed = {"x": np.eye(8, dtype=np.float32)}
    runner = CountingRunner()
    per_call = block_fn(runner, feed, P.PER_CALL)(7)
    assert len(per_call) == 7 and runner.calls == 7 and all(v > 0 for v in per_call)
    pipelined = block_fn(runner, feed, P.PIPELINED)(7)
    assert len(pipelined) == 1 and runner.calls == 14 and pipelined[0] > 0


def test_pooled_measurements_that_disagree_get_an_interval_spanning_them() -> None:
    """Two processes' measurements, each tight but 20 % apart: pooling their cycles as one sample would claim
    a tight interval between them; the random-effects pool covers both."""
    a = [math.log(2.0) + e for e in (-0.004, -0.002, 0.0, 0.001, 0.002, 0.003, 0.004, -0.001)]
    b = [math.log(2.4) + e for e in (-0.004, -0.002, 0.0, 0.001, 0.002, 0.003, 0.004, -0.001)]
    naive = speedup_from_log_ratios(a + b, 0.95)
    pooled = pooled_speedup([a, b], 0.95)
    assert pooled.estimate == pytest.approx(math.sqrt(2.0 * 2.4), rel=0.01)
    assert pooled.low < 2.0 and pooled.high > 2.4 and pooled.rounds == 16
    assert naive.high - naive.low < pooled.high - pooled.low
    same = pooled_speedup([a, a], 0.95)  # agreeing measurements: no between-measurement variance
    single = speedup_from_log_ratios(a, 0.95)
    assert single.low < same.low < same.estimate < same.high < single.high
    assert pooled_speedup([a, a[:3]], 0.95) == single  # too short for an interval: left out
    with pytest.raises(ValueError, match="6 cycles"):
        pooled_speedup([a[:3]], 0.95)


def test_a_candidate_clearly_ahead_of_the_incumbent_stops_as_ahead() -> None:
    clock = SimClock()
    r = P.measure_paired(
        engine(clock, 1.0, 0.02, 9),
        engine(clock, 2.0, 0.02, 10),
        POLICY,
        incumbent=1.2,
        incumbent_high=1.3,
        clock=clock,
    )
    assert r.stop == P.AHEAD and r.cycles == 6 and r.speedup is not None and r.speedup.low > 1.3
    r = P.measure_paired(
        engine(clock, 1.0, 0.02, 9),
        engine(clock, 2.0, 0.02, 10),
        POLICY,
        incumbent=1.9,
        incumbent_high=2.1,
        clock=clock,
    )
    assert r.stop == P.PRECISION  # overlapping the incumbent's interval: measured to the target


class ScriptedProbe:
    """Contention as scripted per block (True: other work took a core), in place of /proc readings."""

    def __init__(self, contended: Callable[[int], bool]) -> None:
        self.block, self.contended = 0, contended

    def snapshot(self) -> None:
        return None

    def since(self, start: None) -> P.Load:
        self.block += 1
        busy = self.contended(self.block)
        return P.Load(0.01, 1.0 if busy else 0.0, 0.5 if busy else 0.0, 1.0, 2.0)


def test_cycles_timed_while_other_work_took_a_core_are_set_aside() -> None:
    clock = SimClock()
    probe = ScriptedProbe(lambda block: 9 <= block <= 24)  # cycles 3 to 6 have a contended block
    r = P.measure_paired(engine(clock, 1.0, 0.02, 11), engine(clock, 2.0, 0.02, 12), POLICY, clock=clock, probe=probe)  # type: ignore[arg-type]
    assert r.contended_cycles == 4 and not r.contended and r.cycles == len(r.log_ratios) >= 6
    assert r.contention["contended_blocks"] == 16 and r.contention["blocks"] == 4 * (r.cycles + 4)
    slow = P.measure_paired(
        engine(clock, 3.0, 0.02, 13),
        engine(clock, 2.0, 0.02, 14),
        POLICY,
        incumbent=1.0,
        clock=clock,
        probe=ScriptedProbe(lambda block: True),
    )  # type: ignore[arg-type]
    assert (
        slow.stop == P.CAP and slow.contended and slow.speedup is not None
    )  # never stopped as slow on contended cycles
    assert slow.summary()["contended"] is True


SPIN_ON_CPU0 = "import os\nos.sched_setaffinity(0, {0})\nwhile True:\n    pass\n"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_the_probe_sees_another_process_on_our_core() -> None:
    import subprocess
    import sys

    from tuner.measure.contention import Probe

    before = os.sched_getaffinity(0)
    spinner = subprocess.Popen([sys.executable, "-c", SPIN_ON_CPU0])
    try:
        os.sched_setaffinity(0, {0})  # this thread and the spinner share one core: it must wait for it
        probe = Probe()
        start = probe.snapshot()
        deadline = time.perf_counter() + 0.5
        while time.perf_counter() < deadline:
            pass
        load = probe.since(start)
    finally:
        os.sched_setaffinity(0, before)
        spinner.kill()
        spinner.wait()
    assert load is not None and load.contended, load
    assert load.others_cores > 0.2 and load.wait_share > 0.2
