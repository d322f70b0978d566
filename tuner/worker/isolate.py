"""Run a job in a fresh child process with a wall-clock timeout and classify how it ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tuner import job as J


class ChildHandle:
    """The running child, so a signal handler can kill it (and its process group)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()

    def kill(self) -> None:
        """Kill the child's whole process group, if one is running."""
        with self.lock:
            if self.proc is not None and self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def run_isolated(job: J.Job, trial_dir: Path, handle: ChildHandle | None = None, env: dict[str, str] | None = None) -> J.Result:
    """Run `job` in `python -m tuner.worker.child` and return its result, whatever happened to it."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    job_path, result_path, log_path = trial_dir / "job.json", trial_dir / "result.json", trial_dir / "child.log"
    result_path.unlink(missing_ok=True)
    job.write(job_path)
    handle = handle or ChildHandle()
    with open(log_path, "wb") as log:
        with handle.lock:
            handle.proc = subprocess.Popen(
                [sys.executable, "-m", "tuner.worker.child", str(job_path), str(result_path)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env={**os.environ, **(env or {})},
            )
        proc = handle.proc
        timed_out = False
        try:
            rc = proc.wait(timeout=job.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            handle.kill()
            rc = proc.wait()
    res = _read(result_path)
    tail = _tail(log_path)
    if timed_out:
        res.status, res.message = J.TIMEOUT, f"no result after {job.timeout_s:g} s (during {res.phase or 'start-up'}); child killed"
    elif rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        hint = " (killed: out of memory, or by a signal from outside)" if -rc == signal.SIGKILL else ""
        res.status, res.message = J.CRASH_SIGNAL, f"child died of {name} during {res.phase or 'start-up'}{hint}"
    elif rc != 0 or res.status == J.CRASH_EXIT:
        res.status = J.CRASH_EXIT
        res.message = f"child exited with status {rc} during {res.phase or 'start-up'}: {tail[-300:]}"
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
