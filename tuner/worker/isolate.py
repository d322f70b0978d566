"""Run a job in a fresh child process with a wall-clock timeout and classify how it ended.

The child starts under a shared hold of the host lock taken here and handed down to it
(`tuner.measure.exclusive`): its start-up never overlaps another worker's CPU timing. Lock waits are
not the route's time: the hold is taken before the deadline starts, the child's own waits (which it
reports, `tuner.job.wait_log`) extend the deadline, and a wait that expires ends the trial
as an `environment-error` (never counted, never cached).
The child is tied to this process (`PR_SET_PDEATHSIG`, see `tuner.worker.lifeline`) and carries its
own deadline, so it never outlives a worker killed with SIGKILL and never hangs on as an orphan.
Where the job allows it (`Job.preload`, from `Backend.fork_safe`) the child is forked from a server
that has imported what it needs (`tuner.worker.forkserver`) instead of being a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tuner import job as J
from tuner.measure.exclusive import HOST, STARTUP_HOLD_ENV, DeviceLock, LockWaitExpired, waited
from tuner.store.urls import env_without_credentials
from tuner.worker.environment import EXIT_ENVIRONMENT, environment_fault
from tuner.worker.forkserver import Child, start_child
from tuner.worker.lifeline import PARENT_ENV, STARTER_ENV

if TYPE_CHECKING:
    from tuner.worker.heartbeat import Heartbeat


REAPED = "its trial was reaped while this worker was stopped (its route re-queued); child not run or killed"


class ChildHandle:
    """The running child, so a signal handler can kill it (and its process group).

    Lock-free on purpose: the handler runs in the main thread, possibly while that thread is inside
    `Popen`; it sets `killed` and kills what is there, and `run_isolated` kills a child that started
    after the flag was set.
    """

    def __init__(self) -> None:
        self.proc: Child | None = None
        self.killed = False

    def kill(self) -> None:
        """Kill the child's whole process group, if one is running, and any child started later."""
        self.killed = True
        self.kill_running()

    def kill_running(self) -> None:
        """Kill the child's whole process group, if one is running."""
        proc = self.proc
        if proc is not None and proc.returncode is None:
            _killpg(proc.pid)


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a trial's child: ours without credentials (it never talks to the database) and without the
    pid of whoever asked for this process (a forked child gets its own starter's), plus `extra` and our pid."""
    env = {k: v for k, v in env_without_credentials(os.environ).items() if k != STARTER_ENV}
    return {**env, **(extra or {}), PARENT_ENV: str(os.getpid())}


def result_file(trial_dir: Path) -> Path:
    """Where the child run in `trial_dir` writes its result, and its phase as it goes."""
    return trial_dir / "result.json"


def run_isolated(
    job: J.Job,
    trial_dir: Path,
    handle: ChildHandle | None = None,
    env: dict[str, str] | None = None,
    lease: Heartbeat | None = None,
) -> J.Result:
    """Run `job` in a child (`python -m tuner.worker.child`, or forked from its server) and return its result, whatever
    happened to it.

    `lease`: the trial's, beating. A child is started only while it holds (checked once the start-up hold is had, the
    last wait before the start) and is killed once it is lost (`handle.kill_running`, the lease's `on_lost`): the
    trial was reaped and its route re-queued, and it is `interrupted` here.
    """
    job_path, result_path, log_path = trial_dir / "job.json", result_file(trial_dir), trial_dir / "child.log"
    handle = handle or ChildHandle()
    try:
        trial_dir.mkdir(parents=True, exist_ok=True)
        result_path.unlink(missing_ok=True)
        job.write(job_path)
        log = open(log_path, "wb")
    except OSError as exc:
        fault = environment_fault(exc)
        if fault is None:
            raise
        return J.Result(status=J.ENVIRONMENT_ERROR, phase="start-up", message=f"could not prepare {trial_dir}: {fault}")
    waits = J.wait_log(result_path)
    waits.unlink(missing_ok=True)
    with log:
        try:
            with (
                DeviceLock(HOST, wait_s=job.lock_wait_s).shared() if job.build_holds_cores else contextlib.nullcontext()
            ) as hold:
                if lease is not None and not lease.held():
                    return J.Result(status=J.INTERRUPTED, phase="start-up", message=REAPED)
                kept = hold.fd if hold is not None and hold.held else None
                handed = {STARTUP_HOLD_ENV: str(kept)} if kept is not None else {}
                handle.proc = proc = start_child(
                    [str(job_path), str(result_path)],
                    child_env({**(env or {}), **handed}),
                    log.fileno(),
                    kept,
                    job.preload,
                    child_env(),
                )
        except LockWaitExpired as exc:
            return J.Result(status=J.ENVIRONMENT_ERROR, phase="start-up", message=str(exc))
        if handle.killed or (lease is not None and lease.lost.is_set()):  # a stop or a reap while it was started
            _killpg(proc.pid)
        timed_out, rc = wait_child(proc, time.monotonic(), job.timeout_s, waits)
    if lease is not None and lease.lost.is_set():
        return J.Result(status=J.INTERRUPTED, phase=_read(result_path).phase, message=REAPED)
    return classify(rc, timed_out, handle.killed, job.timeout_s, _read(result_path), _tail(log_path))


def wait_child(proc: Child, started: float, timeout_s: float, waits: Path) -> tuple[bool, int]:
    """Wait for the child until `timeout_s` of its own time (its reported lock waits not counted) have passed
    since monotonic `started`; kill it then. (timed out, exit status)."""
    while True:
        now = time.monotonic()
        left = started + timeout_s + waited(waits, now) - now
        try:
            return False, proc.wait(timeout=max(left, 0.01))
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if started + timeout_s + waited(waits, now) - now > 0:
                continue  # the child waited for a lock meanwhile: its deadline moved
            _killpg(proc.pid)
            return True, proc.wait()


def classify(rc: int, timed_out: bool, stopped: bool, timeout_s: float, res: J.Result, tail: str) -> J.Result:
    """The result, given how the child ended (`rc`) and what it wrote."""
    during = res.phase or "start-up"
    if timed_out:
        res.status, res.message = J.TIMEOUT, f"no result after {timeout_s:g} s (during {during}); child killed"
    elif rc == -signal.SIGKILL and not stopped:
        res.status, res.message = (
            J.ENVIRONMENT_ERROR,
            f"child killed by SIGKILL during {during} (out of memory, or from outside)",
        )
    elif rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        res.status, res.message = J.CRASH_SIGNAL, f"child died of {name} during {during}"
    elif rc == EXIT_ENVIRONMENT:
        res.status, res.message = J.ENVIRONMENT_ERROR, f"child could not write its result during {during} (disk full?)"
    elif rc != 0 or res.status == J.CRASH_EXIT:
        res.status = J.CRASH_EXIT
        res.message = f"child exited with status {rc} during {during}: {tail[-300:]}"
    res.log = (res.log + "\n" + tail).strip()[-20000:]
    return res


def _read(path: Path) -> J.Result:
    try:
        return J.Result.from_json(path.read_text())
    except (OSError, ValueError, TypeError):
        return J.Result(status=J.CRASH_EXIT)


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        return path.read_bytes()[-limit:].decode(errors="replace")
    except OSError:
        return ""
