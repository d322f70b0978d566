"""The trial's child process: build -> load -> quick accuracy gate -> timing -> full accuracy.

A child started while the study's baseline trial still runs waits for the baseline's engine between
its gate and its timing (`tuner.worker.handover`).

Run as `python -m tuner.worker.child JOB.json RESULT.json`, or forked from a server started as
`python -m tuner.worker.child --serve FD MODULE...` (`tuner.worker.forkserver`). Whatever happens inside (a segfault in
a native compiler, a hang, an out-of-memory kill) ends this process only; the worker classifies it.
The current phase is written to RESULT.json.phase before each step so a crash can be attributed.
Each phase is one function below; `run_job` strings them together and classifies what they raise.
The child dies with its worker (`PR_SET_PDEATHSIG`) and ends itself at its own deadline (SIGALRM,
whose default action ends the process even inside native code), a little after the worker's. Its
waits for host and device locks are bounded (`Job.lock_wait_s`, in all), reported beside its result
(`tuner.job.wait_log`) so the worker keeps them out of the deadline, and one that expires is an
`environment-error`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from tuner import job as J
from tuner.backends import get_backend
from tuner.backends.base import Artifact, Backend, BuildContext, Feed, ModelInfo, Runner
from tuner.errors import TrialFailure
from tuner.files import atomic_write
from tuner.measure.accuracy import Outputs
from tuner.measure.cores import pin
from tuner.measure.exclusive import HOST, DeviceLock, inherited_startup_hold, report_waits
from tuner.measure.inputs import file_hash, read_feeds
from tuner.measure.judge import Judge, judge_of
from tuner.measure.memory import MemoryProbe
from tuner.measure.reference import load_reference
from tuner.measure.user_metric import MetricError
from tuner.spec.shapes import shape_label
from tuner.worker import handover
from tuner.worker.environment import EXIT_ENVIRONMENT, environment_fault
from tuner.worker.lifeline import die_with_parent
from tuner.worker.timing import GPU_CLOCKS, TimedShape, time_trial

DEADLINE_MARGIN_S = 5.0  # the worker kills at timeout_s; the child's own alarm is the backstop


@dataclass
class ShapeFeeds:
    """One input shape the trial is checked and timed at: its inputs, weight, validation feeds and reference."""

    inputs: dict[str, list[int]]
    weight: float
    feeds: list[Feed]
    reference: list[Outputs]


@dataclass
class Trial:
    """One job's inputs and its result as it progresses; `enter` starts a phase and saves the result so far.

    `sets`: the shapes it is checked and timed at (`[[objective.shapes]]`), else one: the study's feeds.
    """

    job: J.Job
    result_path: Path | None  # None: the result is only returned (a trial run in-process, e.g. replayed)
    backend: Backend
    feeds: list[Feed]
    reference: list[Outputs]
    ctx: BuildContext
    judge: Judge
    sets: list[ShapeFeeds] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    res: J.Result = field(default_factory=lambda: J.Result(status=J.CRASH_EXIT))
    started: float = field(default_factory=time.perf_counter)

    @classmethod
    def open(cls, job: J.Job, result_path: Path) -> Trial:
        """Read the job's feeds and reference outputs (at every shape) and set up the build context."""
        t = cls.start(
            job,
            result_path,
            get_backend(job.backend),
            read_feeds(Path(job.feeds_path)),
            load_reference(Path(job.reference_path)),
        )
        if job.shapes:
            t.sets = [
                ShapeFeeds(
                    s["inputs"],
                    float(s["weight"]),
                    read_feeds(Path(s["feeds_path"])),
                    load_reference(Path(s["reference_path"])),
                )
                for s in job.shapes
            ]
        return t

    @classmethod
    def start(
        cls, job: J.Job, result_path: Path | None, backend: Backend, feeds: list[Feed], reference: list[Outputs]
    ) -> Trial:
        """A trial of `job` on `backend` with the feeds and reference outputs given (already in memory)."""
        log: list[str] = []
        shapes = tuple(({k: tuple(v) for k, v in s["inputs"].items()}, float(s["weight"])) for s in job.shapes)
        model = ModelInfo(Path(job.model_path), {k: tuple(v) for k, v in job.input_shapes.items()}, job.options, shapes)
        ctx = BuildContext(
            model, Path(job.work_dir), Path(job.out_dir), feeds, time.monotonic() + job.timeout_s, log.append
        )
        sets = [ShapeFeeds(dict(job.input_shapes), 1.0, feeds, reference)]
        judge = judge_of(job.metric, job.tolerance, job.atol, job.rtol, job.outputs)
        return cls(job, result_path, backend, feeds, reference, ctx, judge, sets, log)

    def enter(self, name: str) -> None:
        """Close the current phase's clock, start phase `name` and write the result so far."""
        self._stop_clock()
        self.res.phase = name
        if self.result_path is not None:
            self.result_path.write_text(self.res.to_json())

    def _stop_clock(self) -> None:
        now = time.perf_counter()
        if self.res.phase:
            self.res.phase_s[self.res.phase] = now - self.started
        self.started = now

    def finish(self) -> J.Result:
        """Close the last phase's clock and attach the log."""
        self._stop_clock()
        self.res.log = "\n".join(self.log)[-20000:]
        return self.res


def build_phase(t: Trial) -> Artifact:
    """Build the route; record the artifact's size, hash and build time."""
    t.enter("build")
    artifact = t.backend.build(t.job.route, t.ctx)
    t.res.build_s = artifact.build_s
    t.res.artifact_path = str(artifact.path)
    t.res.artifact_sha256 = file_hash(artifact.path)
    t.res.artifact_bytes = artifact.path.stat().st_size
    t.res.build_info = json.loads(json.dumps(dict(artifact.info), default=str))
    return artifact


def load_phase(t: Trial, artifact: Artifact) -> Runner:
    """Load the artifact; the caller owns the runner (use it in a `with` block)."""
    t.enter("load")
    return t.backend.load(artifact, t.job.route, t.ctx)


def _at(t: Trial, s: ShapeFeeds) -> str:
    return f" at {shape_label(s.inputs)}" if len(t.sets) > 1 else ""


def _worst_of(per_shape: list[dict[str, float]]) -> dict[str, float]:
    """Per output, the worst value over the shapes."""
    out: dict[str, float] = {}
    for per_output in per_shape:
        for k, v in per_output.items():
            out[k] = max(out.get(k, v), v)
    return out


def gate_phase(t: Trial, runner: Runner) -> list[list[Outputs]] | None:
    """The quick accuracy gate on the first `gate_samples` feeds of every shape: their outputs, or None when it
    failed at one."""
    t.enter("gate")
    res, gate, judge = t.res, t.job.gate_samples, t.judge
    outs, per_shape = [], []
    for s in t.sets:
        gate_out = [runner.infer(f) for f in s.feeds[:gate]]
        values = judge.values(gate_out, s.reference[:gate])
        outs.append(gate_out)
        per_shape.append(values)
        res.accuracy_per_output = _worst_of(per_shape)
        res.accuracy = judge.worst(res.accuracy_per_output)
        breach = judge.breach(values, gate_out, s.reference[:gate])
        if breach is not None:
            res.status = J.GATE_FAILED
            res.message = f"{breach} on the first {gate} feed(s){_at(t, s)}"
            return None
    return outs


def time_phase(t: Trial, runner: Runner) -> None:
    """Time the engine on the first feed of every shape, paired with the study's baseline engine
    (`tuner.worker.timing`)."""
    t.enter("time")
    shapes = [TimedShape(s.inputs, s.weight, s.feeds[0]) for s in t.sets]
    time_trial(t.job, t.backend, t.ctx, runner, shapes, t.res)


def accuracy_phase(t: Trial, runner: Runner, gate_out: list[list[Outputs]]) -> None:
    """Full accuracy over every feed of every shape (the gate's outputs reused); sets the final status."""
    t.enter("accuracy")
    job, res, judge = t.job, t.res, t.judge
    per_shape, all_outputs = [], []
    for s, first in zip(t.sets, gate_out):
        outputs = first + [runner.infer(f) for f in s.feeds[job.gate_samples :]]
        per_shape.append(judge.values(outputs, s.reference))
        all_outputs.append(outputs)
    res.accuracy_per_output = _worst_of(per_shape)
    res.accuracy = judge.worst(res.accuracy_per_output)
    res.status = J.OK if res.accuracy <= job.tolerance else J.ACCURACY
    if res.status == J.ACCURACY:
        at = max(range(len(per_shape)), key=lambda i: judge.worst(per_shape[i]))
        s = t.sets[at]
        breach = judge.breach(per_shape[at], all_outputs[at], s.reference)
        res.message = f"{breach} on {len(s.feeds)} feeds{_at(t, s)}"


def run_job(job: J.Job, result_path: Path, startup_hold: int | None = None) -> J.Result:
    """Execute one trial and return its result (also written to `result_path` as it progresses).

    `startup_hold`: the shared host hold this process started under (from its worker); the build keeps it.
    """
    return run_trial(Trial.open(job, result_path), startup_hold)


def run_trial(t: Trial, startup_hold: int | None = None) -> J.Result:
    """Build, load, gate, time and check the trial `t`, classifying what fails; its result."""
    job, res = t.job, t.res
    cores = DeviceLock(HOST)  # everything but the timing holds the host's cores shared: no timing runs meanwhile
    if job.objective.cores is not None and t.result_path is not None:  # (a trial run in-process pins nothing)
        pin(job.objective.cores)  # before anything starts a thread: every engine's pool inherits it
    try:
        with (
            cores.shared(startup_hold)
            if job.build_holds_cores or startup_hold is not None
            else contextlib.nullcontext()
        ):
            artifact = build_phase(t)
        memory = MemoryProbe.start()
        with cores.shared():
            runner_cm = load_phase(t, artifact)
        with runner_cm as runner:
            with cores.shared():
                gate_out = gate_phase(t, runner)
            res.peak_memory_mb, res.memory_kind = memory.peak(runner.timing_info().get("clock") in GPU_CLOCKS)
            if gate_out is not None:
                if t.job.pairing_path:  # started while the baseline trial ran: its engine is handed over now
                    t.enter(handover.PHASE)
                    t.job = handover.await_pairing(t.job)
                time_phase(t, runner)
                if res.status != J.SLOW:
                    with cores.shared():
                        accuracy_phase(t, runner, gate_out)
    except Exception as exc:
        fault = environment_fault(exc)
        if fault is not None:  # disk full, out of memory, device busy: the machine's state, never cached
            res.status, res.message = J.ENVIRONMENT_ERROR, fault
        elif isinstance(exc, TrialFailure):  # the route's own failure, with the class its type carries
            res.status, res.message = exc.failure_class, str(exc)
        else:  # any other error in build/run is this route's failure, with its class name
            res.status = J.BUILD_ERROR if res.phase == "build" else J.RUNTIME_ERROR
            res.message = f"{type(exc).__name__}: {exc}"
        if fault is not None or not isinstance(exc, TrialFailure) or isinstance(exc, MetricError):
            t.log.append(traceback.format_exc())
    return t.finish()


def main(argv: list[str]) -> int:
    """Entry point: run the job and write the final result."""
    die_with_parent(signal.SIGKILL)
    startup_hold = inherited_startup_hold()
    job_path, result_path = Path(argv[0]), Path(argv[1])
    job = J.Job.read(job_path)
    report_waits(J.wait_log(result_path), job.lock_wait_s)
    signal.alarm(math.ceil(job.timeout_s + (job.lock_wait_s or 0.0) + DEADLINE_MARGIN_S))
    try:
        res = run_job(job, result_path, startup_hold)
        atomic_write(result_path, res.to_json())
    except (OSError, MemoryError) as exc:
        if environment_fault(exc) is None:
            raise
        os._exit(EXIT_ENVIRONMENT)  # no flushing: the log is likely on the same full disk
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        from tuner.worker.forkserver import serve

        sys.exit(serve(int(sys.argv[2]), sys.argv[3:]))
    sys.exit(main(sys.argv[1:]))
