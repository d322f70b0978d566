"""The trial's child process: build -> load -> quick accuracy gate -> timing -> full accuracy.

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
from tuner.measure.accuracy import Outputs, Tolerances, compare, worst
from tuner.measure.exclusive import HOST, DeviceLock, inherited_startup_hold, report_waits
from tuner.measure.inputs import file_hash, read_feeds
from tuner.measure.memory import MemoryProbe
from tuner.measure.reference import load_reference
from tuner.worker.environment import EXIT_ENVIRONMENT, environment_fault
from tuner.worker.lifeline import die_with_parent
from tuner.worker.timing import GPU_CLOCKS, time_trial

DEADLINE_MARGIN_S = 5.0  # the worker kills at timeout_s; the child's own alarm is the backstop


@dataclass
class Trial:
    """One job's inputs and its result as it progresses; `enter` starts a phase and saves the result so far."""

    job: J.Job
    result_path: Path | None  # None: the result is only returned (a trial run in-process, e.g. replayed)
    backend: Backend
    feeds: list[Feed]
    reference: list[Outputs]
    ctx: BuildContext
    tol: Tolerances
    log: list[str] = field(default_factory=list)
    res: J.Result = field(default_factory=lambda: J.Result(status=J.CRASH_EXIT))
    started: float = field(default_factory=time.perf_counter)

    @classmethod
    def open(cls, job: J.Job, result_path: Path) -> Trial:
        """Read the job's feeds and reference outputs and set up the build context."""
        return cls.start(
            job,
            result_path,
            get_backend(job.backend),
            read_feeds(Path(job.feeds_path)),
            load_reference(Path(job.reference_path)),
        )

    @classmethod
    def start(
        cls, job: J.Job, result_path: Path | None, backend: Backend, feeds: list[Feed], reference: list[Outputs]
    ) -> Trial:
        """A trial of `job` on `backend` with the feeds and reference outputs given (already in memory)."""
        log: list[str] = []
        model = ModelInfo(Path(job.model_path), {k: tuple(v) for k, v in job.input_shapes.items()}, job.options)
        ctx = BuildContext(
            model, Path(job.work_dir), Path(job.out_dir), feeds, time.monotonic() + job.timeout_s, log.append
        )
        return cls(job, result_path, backend, feeds, reference, ctx, Tolerances(job.atol, job.rtol), log)

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


def gate_phase(t: Trial, runner: Runner) -> list[Outputs] | None:
    """The quick accuracy gate on the first `gate_samples` feeds: their outputs, or None when it failed."""
    t.enter("gate")
    job, res, gate = t.job, t.res, t.job.gate_samples
    gate_out = [runner.infer(f) for f in t.feeds[:gate]]
    per_output = compare(job.metric, gate_out, t.reference[:gate], t.tol)
    res.accuracy, res.accuracy_per_output = worst(per_output), per_output
    if res.accuracy > job.tolerance:
        res.status = J.GATE_FAILED
        res.message = f"{job.metric}={res.accuracy:.4g} > {job.tolerance:g} on the first {gate} feed(s)"
        return None
    return gate_out


def time_phase(t: Trial, runner: Runner) -> None:
    """Time the engine on the first feed, paired with the study's baseline engine (`tuner.worker.timing`)."""
    t.enter("time")
    time_trial(t.job, t.backend, t.ctx, runner, t.feeds[0], t.res)


def accuracy_phase(t: Trial, runner: Runner, gate_out: list[Outputs]) -> None:
    """Full accuracy over every feed (the gate's outputs reused); sets the final status."""
    t.enter("accuracy")
    job, res = t.job, t.res
    outputs = gate_out + [runner.infer(f) for f in t.feeds[job.gate_samples :]]
    per_output = compare(job.metric, outputs, t.reference, t.tol)
    res.accuracy, res.accuracy_per_output = worst(per_output), per_output
    res.status = J.OK if res.accuracy <= job.tolerance else J.ACCURACY
    if res.status == J.ACCURACY:
        res.message = f"{job.metric}={res.accuracy:.4g} > {job.tolerance:g} on {len(t.feeds)} feeds"


def run_job(job: J.Job, result_path: Path, startup_hold: int | None = None) -> J.Result:
    """Execute one trial and return its result (also written to `result_path` as it progresses).

    `startup_hold`: the shared host hold this process started under (from its worker); the build keeps it.
    """
    return run_trial(Trial.open(job, result_path), startup_hold)


def run_trial(t: Trial, startup_hold: int | None = None) -> J.Result:
    """Build, load, gate, time and check the trial `t`, classifying what fails; its result."""
    job, res = t.job, t.res
    cores = DeviceLock(HOST)  # everything but the timing holds the host's cores shared: no timing runs meanwhile
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
        if fault is not None or not isinstance(exc, TrialFailure):
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
