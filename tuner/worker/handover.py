"""The pairing a trial's child is handed after it started: written by its worker, awaited before the timing.

A trial that starts while the study's baseline trial is still running needs the baseline's engine
only to be timed against it (`tuner.worker.timing`), so its child starts at once and builds, loads
and gates its route meanwhile: with several workers the first ones do not sit idle for a whole
baseline trial. Its job names a file (`Job.pairing_path`); the worker waits for the baseline as it
would before starting a child (`tuner.worker.pairing`: bounded, the worker reaping meanwhile) and
writes the job's pairing fields there once they are settled (`hand_over`), or why there are none
(`{"error": ...}`), looking at the study every tenth of a second once the child waits (`waiting`)
and as seldom as a waiting worker did before meanwhile. The child waits for that file just before
its timing (`await_pairing`), holding no lock, so the baseline's own timing is never held up by it.
The wait is not the route's time: it is reported as lock waits are
(`tuner.measure.exclusive.reported_wait`), so the worker's deadline moves, the child's own deadline
(SIGALRM) stops meanwhile, and it is recorded as `baseline_wait_s`. It is bounded by
`Job.pairing_wait_s` (and a margin): a worker that never writes (stopped) ends the trial as an
`environment-error`, as a worker that gave up waiting does.
"""

from __future__ import annotations

import errno
import json
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tuner import job as J
from tuner.files import atomic_write
from tuner.measure.exclusive import reported_wait

POLL_S = 0.05  # how often a waiting child looks for its pairing
PHASE = "baseline-wait"  # the child's phase (`tuner.job.Result.phase`) while it waits
MARGIN_S = 5.0  # beyond `Job.pairing_wait_s`, for the worker's own last look and its write


def waiting(result_path: Path) -> bool:
    """Whether the child writing `result_path` is waiting for its pairing now (its phase says so)."""
    try:
        return json.loads(result_path.read_text()).get("phase") == PHASE
    except (OSError, ValueError):  # not written yet, or being rewritten
        return False


def hand_over(path: Path, fields: dict[str, Any]) -> None:
    """Give the child waiting on `path` its pairing `fields` (`tuner.job.Job`'s), or {"error": why} for none."""
    atomic_write(path, json.dumps(fields))


def await_pairing(job: J.Job) -> J.Job:
    """`job` with the pairing its worker handed over, once it has; `TimeoutError` (ETIMEDOUT: the machine's state,
    an `environment-error`) when the worker gave up waiting for the baseline or wrote nothing in time."""
    path = Path(job.pairing_path)
    left = signal.alarm(0)  # not the route's time: the child's own deadline stops meanwhile
    started = time.monotonic()
    try:
        with reported_wait():
            while not path.exists():
                if time.monotonic() - started > job.pairing_wait_s + MARGIN_S:
                    raise TimeoutError(errno.ETIMEDOUT, f"no pairing from the worker in {job.pairing_wait_s:g} s")
                time.sleep(POLL_S)
        fields = json.loads(path.read_text())
    finally:
        if left:
            signal.alarm(left)
    if "error" in fields:
        raise TimeoutError(errno.ETIMEDOUT, str(fields["error"]))
    return replace(job, **{**fields, "baseline_wait_s": round(time.monotonic() - started, 4)})
