"""The timing phase of a trial's child: paired against the study's baseline engine, exclusive on its device.

1. **The baseline engine.** The job names the baseline trial's stored artifact (`job.baseline`): a
   worker whose trial starts while the baseline trial is still running waits for it before starting
   the child (`tuner.worker.pairing`, outside the trial's deadline). Without one (the baseline failed,
   nobody runs it, or it ran on another host) the trial is measured unpaired: `paired` False and
   `unpaired` says why. The baseline is loaded by the trial's own backend from its stored artifact,
   holding the host lock shared like a build. Inductor recompiles it from its on-disk cache:
   `baseline_load_s` records what that costs per trial. The two engines do not reach the timing alike
   (the route's is loaded first and gated, and the gate's outputs stay alive): in an A/A test of one
   engine against itself with short timings the route's engine timed about 1 % faster in 14 of 16
   processes (docs/measurement.md). With `job.swapped` the engines trade places (`route` is the default's,
   `baseline` the candidate's engine, timed as the candidate; `swapped` is recorded), and the
   confirmation alternates it, so that advantage falls to each side in turn.
2. **The timing.** The device lock is taken exclusive (`tuner.measure.exclusive`); the load average
   is read before and after, and on a GPU the SM/memory clocks before and after every attempt; then
   `tuner.measure.paired.measure_paired` runs with the job's policy, unset fields taking the
   device's defaults (declared with each setting in `tuner.objective`; the GPU's are close to
   trtexec's: at least 200 ms warm-up and 3 s of measurement). The baseline trial itself is measured alone.
3. **The result.** `samples_ms`/`latency` are the candidate's per-call samples as before;
   `Result.paired` holds the summary (`tuner.measure.paired.PairedResult.summary`) plus
   `baseline_latency` (the baseline's statistics in this trial), `log_ratios` (one per ABBA cycle,
   for pooling re-measurements) and `running` ([cycle, estimate, low, high]); `timing_info` gets
   `exclusive`, `device`, `lock_wait_s`, `loadavg_before`/`after`, `clocks_before`/`after` and `affinity`
   (the cores the timing thread was allowed, read during the timing: `[objective] cores` pins them).
   With `[[objective.shapes]]` every shape is timed in turn and the figures combined (`tuner.measure.shapes`).
   Under `contention = "exclusive"` the timing runs at raised priority where permitted, so other work on
   the host hardly gets the cores it needs (`tuner.measure.priority`; `timing_info["priority"]`).
   A CPU timing records per block what other processes took of the cores (`tuner.measure.contention`):
   cycles with a contended block are timed again, and a measurement left without enough clean
   cycles is `contended` (`Result.paired`).
   A measurement stopped as `slow` ends the trial with status `slow` (no full accuracy check).

The measurement runs on the runner's clock (`Runner.clock`): a replayed runner's is virtual, so a
replayed trial is measured by the same code in microseconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner import job as J
from tuner.backends.base import Artifact, Backend, BuildContext, Feed, Runner
from tuner.measure.contention import Probe
from tuner.measure.cores import allowed
from tuner.measure.exclusive import HOST, DeviceLock, device_key, machine_state
from tuner.measure.paired import CLOCK_KEYS, EXCLUSIVE, PIPELINED, SLOW, BlockFn, PairedPolicy, measure_paired
from tuner.measure.priority import raised
from tuner.measure.shapes import combined_summary, heaviest, shape_entry, weighted_latency
from tuner.measure.timing import kept_samples, summarize
from tuner.objective import CPU, GPU

GPU_CLOCKS = ("cuda-event", "cuda-events")
MIN_BLOCK_CALLS = 3  # a block's median of at least 3 calls: one disturbed call does not move it


def policy_for(job: J.Job, gpu: bool) -> PairedPolicy:
    """The job's paired-timing policy, unset settings at the device's defaults (`tuner.objective`)."""
    o = job.objective.resolved(GPU if gpu else CPU)
    return PairedPolicy(
        statistic=o.statistic,
        mode=o.mode,
        target=o.target_halfwidth,
        min_duration_s=float(o.min_duration_s or 0.0),
        min_calls=o.min_repeats,
        cap_s=float(o.timing_cap_s or 0.0),
        block_s=float(o.block_s or 0.0),
        warmup_min_s=o.warmup_s,
        min_block_calls=1 if o.mode == PIPELINED else MIN_BLOCK_CALLS,
        contention=o.contention,
    )


def block_fn(runner: Runner, feed: Feed, mode: str) -> BlockFn:
    """Blocks of `n` calls: per-call latencies in ms, or (pipelined) one mean per call of `n` back-to-back calls."""
    if mode == PIPELINED:
        many = runner.timed_batch(feed)
        return lambda n: [many(n) * 1000.0 / n]
    once = runner.timed(feed)
    return lambda n: [once() * 1000.0 for _ in range(n)]


def _clocks(runner: Runner) -> dict[str, Any]:
    return {k: v for k, v in runner.timing_info().items() if k in CLOCK_KEYS}


def _baseline(job: J.Job, backend: Backend, ctx: BuildContext, stack: ExitStack, info: dict[str, Any]) -> Runner | None:
    """The baseline engine loaded for pairing (owned by `stack`), or None with `info["unpaired"]` saying why."""
    if job.role == "baseline":
        info["unpaired"] = "this is the baseline trial (its speedup is 1 by definition)"
        return None
    base = job.baseline
    if base is None or not Path(str(base.get("path"))).is_file():
        info["unpaired"] = (
            "the baseline trial has no stored artifact on this host"
            if base is not None
            else job.unpaired or "no baseline engine to pair with (timed alone)"
        )
        return None
    t0 = time.perf_counter()
    try:
        with DeviceLock(HOST).shared():
            runner = stack.enter_context(backend.load(Artifact(Path(base["path"]), 0.0), dict(base["route"]), ctx))
    except Exception as exc:  # the baseline's trouble is not this candidate's failure: time it alone, and say why
        info["unpaired"] = f"the baseline engine did not load: {type(exc).__name__}: {exc}"[:300]
        return None
    info.update(baseline_trial=base.get("trial"), baseline_load_s=round(time.perf_counter() - t0, 4))
    return runner


@dataclass(frozen=True)
class TimedShape:
    """One input shape a trial is timed at: its inputs, its weight and the feed it is timed on."""

    inputs: Mapping[str, Any]
    weight: float
    feed: Feed


def time_trial(
    job: J.Job, backend: Backend, ctx: BuildContext, runner: Runner, shapes: list[TimedShape], res: J.Result
) -> None:
    """Time `runner` (paired with the baseline where there is one) at every shape and record it all in `res`.

    One shape is timed as it always was; several are timed one after another under one hold of the device
    lock, each paired with the same baseline engine, and combined (`tuner.measure.shapes`); they never stop
    early as `slow` or `ahead` (one shape's interval against the incumbent's says nothing about the mix).
    """
    info: dict[str, Any] = {
        "role": job.role,
        **({"baseline_wait_s": job.baseline_wait_s} if job.role != "baseline" else {}),
    }
    multi = len(shapes) > 1
    with ExitStack() as stack:
        baseline = _baseline(job, backend, ctx, stack, info)
        if job.swapped:  # the candidate's engine was loaded as the baseline: it is timed as the candidate
            if baseline is None:
                raise RuntimeError(f"the candidate's engine could not be timed: {info['unpaired']}")
            runner, baseline = baseline, runner
            info["swapped"] = True
        gpu = runner.timing_info().get("clock") in GPU_CLOCKS
        policy = policy_for(job, gpu)
        clocks: Callable[[], dict[str, Any]] | None = (lambda: _clocks(runner)) if gpu else None
        mode = job.objective.mode
        before = machine_state()
        replayed = bool(runner.timing_info().get("replayed"))  # a replayed runner's clock is virtual
        with (
            DeviceLock(device_key(gpu)).exclusive() as hold,
            raised(policy.contention == EXCLUSIVE and not replayed) as priority,
        ):
            probe = None if gpu or replayed else Probe()
            results = [
                measure_paired(
                    block_fn(runner, s.feed, mode),
                    block_fn(baseline, s.feed, mode) if baseline is not None else None,
                    policy,
                    incumbent=None if multi else job.incumbent,
                    clocks=clocks,
                    clock=runner.clock,
                    incumbent_high=None if multi else job.incumbent_high,
                    probe=probe,
                )
                for s in shapes
            ]
            affinity = allowed()
        after = machine_state()
        res.timing_info = runner.timing_info()
    weights = [s.weight for s in shapes]
    result = results[heaviest(weights)]
    res.samples_ms = kept_samples(result.candidate_samples)
    res.timing_info.update(
        hold.to_dict(),
        loadavg_before=before["loadavg"],
        loadavg_after=after["loadavg"],
        mode=mode,
        affinity=affinity,
        priority=priority,
        **({"clocks_before": result.clocks[0], "clocks_after": result.clocks[-1]} if result.clocks else {}),
    )
    if multi:
        res.latency = weighted_latency([summarize(r.candidate_samples).to_dict() for r in results], weights)
        res.paired = {**combined_summary(results, weights), **info, "running": []}
        res.paired["shapes"] = [
            shape_entry(s.inputs, s.weight, r, job.objective.statistic) for s, r in zip(shapes, results)
        ]
        if baseline is not None:
            res.baseline_samples_ms = kept_samples(result.baseline_samples)
            res.paired["baseline_latency"] = weighted_latency(
                [summarize(r.baseline_samples).to_dict() for r in results], weights
            )
        return
    res.latency = summarize(result.candidate_samples).to_dict()
    res.paired = {
        **result.summary(),
        **info,
        "log_ratios": [round(d, 6) for d in result.log_ratios],
        "running": result.running,
    }
    if baseline is not None:
        res.baseline_samples_ms = kept_samples(result.baseline_samples)
        res.paired["baseline_latency"] = summarize(result.baseline_samples).to_dict()
    if result.stop == SLOW and result.speedup is not None:
        res.status = J.SLOW
        res.message = (
            f"slower than the incumbent ({job.incumbent:.3f}x): paired speedup {result.speedup.estimate:.3f}x "
            f"[{result.speedup.low:.3f}-{result.speedup.high:.3f}] after {result.cycles} cycles"
        )
