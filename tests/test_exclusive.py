"""The per-device reader/writer timing lock, across real processes (sequenced by pipes and /proc/locks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from optuna.trial import TrialState

from tests.helpers import start_tuner, trials, wait_for_file
from tuner import job as J
from tuner.measure.exclusive import DeviceLock, Hold, LockWaitExpired, device_key
from tuner.spec import load_spec
from tuner.study.setup import Context
from tuner.worker.isolate import run_isolated
from tuner.worker.jobs import make_job

REPO = Path(__file__).resolve().parents[1]

needs_proc_locks = pytest.mark.skipif(
    not Path("/proc/locks").exists(), reason="needs Linux /proc/locks to observe waiting processes"
)


class LockProc:
    """A real process holding a device lock on command (tests/lockproc.py)."""

    def __init__(self, lock_dir: Path, device: str = "host") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.lockproc", device, str(lock_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def reply(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def wait_blocked(pid: int, limit_s: float = 30) -> None:
    """Block until the kernel lists `pid` as waiting for a flock (an event, read from /proc/locks)."""
    deadline = time.monotonic() + limit_s
    while not any("->" in line and f" {pid} " in line for line in Path("/proc/locks").read_text().splitlines()):
        assert time.monotonic() < deadline, f"process {pid} never waited for the lock"
        time.sleep(0.01)


@needs_proc_locks
def test_builds_share_a_timing_excludes_them_and_a_waiting_timing_is_not_starved(tmp_path: Path) -> None:
    b1, b2, timing, b3 = (LockProc(tmp_path) for _ in range(4))
    try:
        b1.send("shared")
        assert b1.reply() == "held shared 0"
        b2.send("shared")
        assert b2.reply() == "held shared 0"  # builds run together
        timing.send("exclusive")
        wait_blocked(timing.proc.pid)  # the timing waits for the builds ...
        b3.send("shared")
        wait_blocked(b3.proc.pid)  # ... and a build arriving now queues behind the waiting timing
        b1.send("release")
        assert b1.reply() == "released"
        b2.send("release")
        assert b2.reply() == "released"
        assert timing.reply() == "held exclusive 1"  # the last build out lets the timing in, before b3
        wait_blocked(b3.proc.pid)  # still waiting (now for the timing to end)
        timing.send("release")
        assert timing.reply() == "released"
        assert b3.reply() == "held shared 0"
    finally:
        for p in (b1, b2, timing, b3):
            p.close()


@needs_proc_locks
def test_one_timing_per_device_and_devices_are_independent(tmp_path: Path) -> None:
    t1, t2, gpu1 = LockProc(tmp_path), LockProc(tmp_path), LockProc(tmp_path, "gpu-1")
    try:
        t1.send("exclusive")
        assert t1.reply() == "held exclusive 1"
        gpu1.send("exclusive")
        assert gpu1.reply() == "held exclusive 1"  # another device: no waiting
        t2.send("exclusive")
        wait_blocked(t2.proc.pid)
        t1.proc.kill()  # a holder that dies releases the lock
        t1.proc.wait(timeout=30)
        assert t2.reply() == "held exclusive 1"
    finally:
        for p in (t2, gpu1):
            p.close()


@needs_proc_locks
def test_a_wait_ends_when_its_stop_is_set_unheld_or_raising(tmp_path: Path) -> None:
    timing = LockProc(tmp_path)
    try:
        timing.send("exclusive")
        assert timing.reply() == "held exclusive 1"
        for go_ahead in (True, False):
            stop, outcome = threading.Event(), []

            def wait(go_ahead: bool = go_ahead, stop: threading.Event = stop, outcome: list = outcome) -> None:
                try:
                    with DeviceLock("host", tmp_path, go_ahead=go_ahead, stop=stop).shared() as hold:
                        outcome.append(hold)
                except TimeoutError as exc:
                    outcome.append(exc)

            waiter = threading.Thread(target=wait)
            waiter.start()
            wait_blocked(os.getpid())  # no bound on the wait but the stop
            stop.set()
            waiter.join(timeout=30)
            (got,) = outcome
            if go_ahead:
                assert isinstance(got, Hold) and not got.held and "waited" in got.reason
            else:
                assert isinstance(got, LockWaitExpired)
        timing.send("release")
        assert timing.reply() == "released"  # held by the other process all along
    finally:
        timing.close()


def test_device_keys_and_an_unusable_lock_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert device_key(True) == "gpu-2" and device_key(False) == "host"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f1e/x")
    assert device_key(True) == "gpu-GPU-8f1e_x"
    blocker = tmp_path / "file"
    blocker.write_text("")
    with DeviceLock("host", blocker / "locks").exclusive() as hold:
        assert not hold.exclusive and "lock directory" in hold.to_dict()["lock_error"]


def _waiting_pids(lock_dir: Path) -> set[int]:
    """PIDs the kernel lists as waiting for a flock on a file in `lock_dir` (/proc/locks lines with `->`).

    Only that directory's files count: tests running beside this one (pytest-xdist) wait on locks of their own.
    """
    files = {
        f"{os.major(s.st_dev):02x}:{os.minor(s.st_dev):02x}:{s.st_ino}" for s in (p.stat() for p in lock_dir.iterdir())
    }
    waiting = (line.split() for line in Path("/proc/locks").read_text().splitlines() if "->" in line)
    return {int(fields[5]) for fields in waiting if fields[6] in files}


@needs_proc_locks
@pytest.mark.parametrize("idle_build", [False, True])
def test_a_trial_starts_and_builds_after_a_cpu_timing_unless_its_backend_leaves_the_cores_free(
    idle_build: bool, write_spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    locks, log = tmp_path / "locks", tmp_path / "builds"
    log.mkdir()
    monkeypatch.setenv("TUNER_LOCK_DIR", str(locks))  # the trial's child inherits it
    spec = write_spec(
        **{
            "backend.name": "bench.fixed_cost:LoggedFixedCostBackend",
            "backend.options": {"build_s": 0.05, "idle_build": idle_build, "build_log": str(log)},
        }
    )
    ctx = Context(load_spec(spec), "")
    job = replace(make_job(ctx, ctx.space.default_route(), tmp_path / "t" / "out"), tolerance=1.0)
    timing = LockProc(locks)  # another process's CPU timing holds the host's cores
    timing.send("exclusive")
    assert timing.reply() == "held exclusive 1"
    before = _waiting_pids(locks)
    results: list[J.Result] = []
    child = threading.Thread(target=lambda: results.append(run_isolated(job, tmp_path / "t")))
    child.start()
    deadline = time.monotonic() + 60
    while not (waiting := _waiting_pids(locks) - before):  # an event: the worker or its child queues on the host lock
        assert time.monotonic() < deadline, "the trial never waited for the host lock"
        time.sleep(0.01)
    records = [json.loads(p.read_text()) for p in log.glob("*.json")]
    if idle_build:  # its child started and built while the timing held the cores, and waits only to load the engine
        assert len(records) == 1 and "end" in records[0], records
        assert os.getpid() not in waiting
    else:
        # the worker waits before it even starts the child (whose imports would use the cores), then hands its hold down
        assert records == [] and waiting == {os.getpid()}
    timing.send("release")
    assert timing.reply() == "released"
    child.join(timeout=120)
    timing.close()
    assert results and results[0].status == J.OK, results
    assert len(list(log.glob("*.json"))) == 1


def _run_on(locks: Path, spec: Path, url: str, log: Path) -> subprocess.Popen[bytes]:
    """`tuner run SPEC --no-confirm` on the timing locks in `locks` (its workers and children inherit them)."""
    return start_tuner("run", str(spec), "--no-confirm", "--storage", url, log=log, env={"TUNER_LOCK_DIR": str(locks)})


@needs_proc_locks
def test_a_worker_samples_only_between_cpu_timings(write_spec, sqlite_url, tmp_path: Path) -> None:
    """Optuna's sampling (and recording) use the cores too: a worker asks for a trial only once no timing runs."""
    locks, log = tmp_path / "locks", tmp_path / "builds"
    log.mkdir()
    spec = write_spec(
        **{
            "backend.name": "bench.fixed_cost:LoggedFixedCostBackend",
            "run.budget": 1,
            "backend.options": {"build_s": 0.0, "build_log": str(log)},
        }
    )
    timing = LockProc(locks)
    timing.send("exclusive")
    assert timing.reply() == "held exclusive 1"
    before = _waiting_pids(locks)
    proc = _run_on(locks, spec, sqlite_url, tmp_path / "run.log")
    try:
        deadline = time.monotonic() + 120
        while not (_waiting_pids(locks) - before):  # an event: the worker queues on the host lock
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run.log").read_text()[-2000:]
            time.sleep(0.01)
        assert not [t for t in trials(sqlite_url, "tiny") if t.state == TrialState.RUNNING]  # nothing asked yet
        assert not list(log.glob("*.json"))
        timing.send("release")
        assert timing.reply() == "released"
        assert proc.wait(timeout=180) == 0, (tmp_path / "run.log").read_text()[-2000:]
    finally:
        proc.kill()
        timing.close()
    assert [t.state for t in trials(sqlite_url, "tiny")] == [TrialState.COMPLETE]


@needs_proc_locks
def test_a_stopped_worker_records_its_trial_in_flight_without_queueing_behind_another_process(
    write_spec, sqlite_url, tmp_path: Path
) -> None:
    """Ctrl-C while another process's timing waits for the trial's build: the worker records the trial in flight
    (interrupted, re-queued) and exits at once, not after that timing, nor after its wait's bound (a trial's
    timeout: 600 s here)."""
    locks, markers = tmp_path / "locks", tmp_path / "markers"
    spec = write_spec(
        **{
            "backend.name": "tests.backends:FaultBackend",
            "backend.options": {"marker_dir": str(markers), "faults": {"0": "block"}},
            "run.budget": 2,
            "run.trial_timeout_s": 600.0,
        }
    )
    proc = _run_on(locks, spec, sqlite_url, tmp_path / "run.log")
    timing = LockProc(locks)
    try:
        wait_for_file(markers / "blocked-0", proc)  # the trial's child builds, holding the host's cores shared
        timing.send("exclusive")
        wait_blocked(timing.proc.pid)  # another process's timing queues behind the build
        proc.send_signal(signal.SIGINT)  # the worker kills its child: the timing gets the cores, and keeps them
        assert timing.reply() == "held exclusive 1"
        assert proc.wait(timeout=300) == 130, (tmp_path / "run.log").read_text()[-2000:]
        timing.send("release")  # the timing held the cores all along
        assert timing.reply() == "released"
    finally:
        proc.kill()
        timing.close()
    ts = trials(sqlite_url, "tiny")
    assert [t.user_attrs.get("failure_class") for t in ts if t.state == TrialState.FAIL] == ["interrupted"]
    assert 0 in [t.user_attrs.get("retry_of") for t in ts if t.state == TrialState.WAITING]  # asked again
