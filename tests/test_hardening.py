"""Hardening of workers and children: no password on a command line, environment errors
retried and never cached, no orphaned children, a run whose workers all died ends with exit 3,
signals at awkward moments, artifacts checked.

Real processes, real signals, a real full disk (tmpfs) and real PostgreSQL; every wait is for an
event the system under test announces (a file, a log line, a lock waiter), never a fixed sleep.
"""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psycopg2
import pytest
from optuna.trial import TrialState

from tests.conftest import REPO, run_study
from tests.helpers import running, start_tuner, status, trials, wait_for_file
from tuner import job as J
from tuner.spec import load_spec
from tuner.study.setup import Context
from tuner.worker.jobs import make_job

FAULT = "tests.backends:FaultBackend"


# -- helpers -------------------------------------------------------------------------------------


def processes() -> Iterator[tuple[int, bytes, bytes]]:
    """(pid, command line, environment) of every process we can read."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            yield int(entry.name), (entry / "cmdline").read_bytes(), (entry / "environ").read_bytes()
        except OSError:
            continue  # it ended meanwhile


def worker_processes(mark: Path) -> list[int]:
    """The live worker processes whose command line names `mark` (a test's own tmp_path, where its study file is)."""
    return [
        pid for pid, cmd, _ in processes() if str(mark).encode() in cmd and b"tuner.worker.main" in cmd and running(pid)
    ]


def wait_for_line(log: Path, text: str, proc: subprocess.Popen[bytes], limit_s: float = 180) -> None:
    """Block until `text` appears in `log` (a line the system under test prints); fail if `proc` exits first."""
    deadline = time.monotonic() + limit_s
    while text not in log.read_text(errors="replace"):
        if proc.poll() is not None:
            raise AssertionError(
                f"process exited ({proc.returncode}) before {text!r} was logged: {log.read_text()[-2000:]}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} not logged within {limit_s} s: {log.read_text()[-2000:]}")
        time.sleep(0.05)


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """End a test's `tuner run` (and its workers) if it is still running."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def cached_statuses(url: str) -> list[str]:
    """The statuses in the content-addressed result cache."""
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT status FROM tuner_results")
            return [r[0] for r in cur.fetchall()]
    finally:
        conn.close()


# -- no password on any command line -------------------------------------------------------


def test_the_storage_password_is_on_no_command_line(write_spec, pg_url, tmp_path: Path) -> None:
    secret = "s3cret-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:10]
    url = pg_url.replace("postgres@", f"postgres:{secret}@")  # trust auth here: the password is carried, not checked
    markers = tmp_path / "markers"
    spec = write_spec(
        **{
            "backend.name": FAULT,
            "backend.options": {"marker_dir": str(markers), "faults": {"0": "block"}},
            "run.budget": 2,
            "run.workers": 2,
        }
    )
    proc = start_tuner(
        "run", str(spec), "--no-confirm", log=tmp_path / "run.log", env={"TUNER_STORAGE": url, "PGPASSWORD": secret}
    )
    try:
        wait_for_file(markers / "blocked-0", proc)  # workers and a trial's child are running now
        seen = [(pid, cmd, env) for pid, cmd, env in processes() if str(tmp_path).encode() in cmd]  # this test's
        assert [pid for pid, cmd, _ in seen if b"tuner.worker.main" in cmd], "no worker process found"
        children = [pid for pid, cmd, _ in seen if b"tuner.worker.child" in cmd]
        assert children, "no trial child found"
        assert not [cmd for _, cmd, _ in seen if secret.encode() in cmd]
        assert not [
            pid for pid, cmd, env in seen if b"tuner.worker.child" in cmd and secret.encode() in env
        ]  # no URL, no PGPASSWORD
        assert not [
            pid for pid, cmd, env in seen if b"tuner.worker.child" in cmd and b"\0PG" in b"\0" + env
        ]  # no libpq variable
        (markers / "release").write_text("")
        assert proc.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        kill_tree(proc)
    assert secret not in (tmp_path / "run.log").read_text()


# -- environment errors ----------------------------------------------------------------


@pytest.mark.parametrize("code", ["ENOSPC", "EIO", "EACCES", "ESTALE", "ETIMEDOUT"])
def test_an_environment_error_is_run_again_and_never_cached(write_spec, pg_url, tmp_path: Path, code: str) -> None:
    markers = tmp_path / "markers"
    spec = write_spec(
        **{
            "backend.name": FAULT,
            "backend.options": {"marker_dir": str(markers), "faults": {"0": f"errno-{code}"}},
            "run.budget": 1,
        }
    )
    run_study(spec, pg_url)
    (t,) = trials(pg_url, "tiny")
    assert (
        t.state == TrialState.COMPLETE and t.user_attrs["failure_class"] == ""
    )  # the second run of its child built it
    assert len(list(markers.glob("build-*"))) == 2
    assert cached_statuses(pg_url) == [J.OK]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (a real disk that can fill up); needs root."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(disk: Path) -> Path:
    """Write a file until the disk is full; returns it.

    Unbuffered: a buffered file would keep the bytes of a partial last write and fail again on close.
    """
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def test_a_full_work_dir_pauses_the_worker_and_poisons_nothing(
    cli, write_spec, pg_url, small_disk: Path, tmp_path: Path
) -> None:
    spec = write_spec(**{"study.work_dir": str(small_disk / "work"), "run.budget": 1})
    run_study(spec, pg_url)  # reference, feeds, baseline
    filler = fill(small_disk)
    proc = start_tuner("run", str(spec), "--no-confirm", "--storage", pg_url, "--trials", "3", log=tmp_path / "run.log")
    try:
        wait_for_line(tmp_path / "run.log", "paused", proc)
        filler.unlink()
        assert proc.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        kill_tree(proc)
    log = (tmp_path / "run.log").read_text()
    assert log.count("paused") == 1 and "ENOSPC" in log and "Traceback" not in log
    ts = trials(pg_url, "tiny")
    env_errors = [t for t in ts if t.user_attrs.get("failure_class") == J.ENVIRONMENT_ERROR]
    assert env_errors and all(t.state == TrialState.FAIL for t in env_errors)
    counted = (TrialState.COMPLETE, TrialState.PRUNED)
    assert all(
        any(r.params == t.params and r.state in counted for r in ts) for t in env_errors
    )  # each route ran again, to the end
    cached = set(cached_statuses(pg_url))
    assert J.OK in cached and cached <= {J.OK, J.GATE_FAILED, J.ACCURACY}  # verdicts of the routes, none of the disk
    s = status(cli("status", str(spec), "--storage", pg_url, "--json"))
    assert s["complete"] + s["pruned"] + s["failed"] == 3 and s["running"] == 0 and s["waiting"] == 0


# -- children die with their worker, and at their own deadline --------------------------


def test_the_child_of_a_sigkilled_worker_is_gone_within_5_s(write_spec, pg_url, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    spec = write_spec(
        **{
            "backend.name": FAULT,
            "backend.options": {"marker_dir": str(markers), "faults": {"0": "orphan"}},
            "run.budget": 2,
        }
    )
    proc = start_tuner("run", str(spec), "--no-confirm", "--storage", pg_url, log=tmp_path / "run.log")
    child = 0
    try:
        wait_for_file(markers / "orphan-0", proc)
        child, worker = map(int, (markers / "orphan-0").read_text().split())
        os.kill(worker, signal.SIGKILL)
        deadline = time.monotonic() + 5.0  # "gone at once" (docs/durability.md), with room to spare
        while running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(child), "the child outlived its SIGKILLed worker by 5 s"
        proc.wait(timeout=120)
    finally:
        kill_tree(proc)
        if child and running(child):
            os.kill(child, signal.SIGKILL)


def test_a_hung_child_ends_itself_at_its_deadline(
    write_spec, sqlite_url, tmp_path: Path, own_timing_locks: Path
) -> None:
    # Its own timing locks: under the run's shared ones another test's timing can outlast the child's 1 s lock
    # wait, and the child then ends with an environment error before its build (and its hang) begins.
    markers = tmp_path / "markers"
    spec = write_spec(
        **{"backend.name": FAULT, "backend.options": {"marker_dir": str(markers), "faults": {"0": "hang"}}}
    )
    ctx = Context(load_spec(spec), sqlite_url)
    job = replace(make_job(ctx, ctx.space.default_route(), tmp_path / "t" / "out"), timeout_s=1.0, lock_wait_s=1.0)
    (tmp_path / "t").mkdir()
    job.write(tmp_path / "t" / "job.json")
    # Started directly, with nobody to enforce the timeout: the child's own alarm must end it.
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tuner.worker.child",
            str(tmp_path / "t" / "job.json"),
            str(tmp_path / "t" / "result.json"),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert child.wait(timeout=120) == -signal.SIGALRM
    finally:
        if child.poll() is None:
            child.kill()


# -- a run whose workers all died ----------------------------------------------------------------


def test_a_run_whose_workers_all_died_exits_3(write_spec, pg_url, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    spec = write_spec(
        **{
            "backend.name": FAULT,
            "backend.options": {"marker_dir": str(markers), "faults": {"0": "block"}},
            "run.budget": 4,
            "run.workers": 2,
        }
    )
    proc = start_tuner("run", str(spec), "--no-confirm", "--storage", pg_url, log=tmp_path / "run.log")
    try:
        wait_for_file(markers / "blocked-0", proc)  # a trial's child blocks in its build
        deadline = time.monotonic() + 60.0
        while len(workers := worker_processes(tmp_path)) < 2:  # the pool starts its workers one after the other
            assert time.monotonic() < deadline, f"the run's 2 workers not found: {workers}"
            time.sleep(0.05)
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=120) == 3, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        kill_tree(proc)
    log = (tmp_path / "run.log").read_text()
    assert "error: 2 worker(s) exited with an error (statuses [-9, -9])" in log and "Traceback" not in log, log[-3000:]


# -- signals at awkward moments -------------------------------------------------------------

SIGNAL_IN_POPEN = """
import os, signal, sys

def _hook(event, args):
    starts = event == "socket.sendmsg" or (  # asks the server to fork the child, or starts one with Popen
        event == "subprocess.Popen" and any("tuner.worker.child" in str(a) for a in (args[1] or []))
    )
    if starts and b"tuner.worker.main" in open("/proc/self/cmdline", "rb").read():
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the worker is starting its trial's child

sys.addaudithook(_hook)
"""


def test_sigterm_while_the_child_is_being_started_stops_the_worker(write_spec, sqlite_url, tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SIGNAL_IN_POPEN)
    spec = write_spec(**{"run.budget": 2})
    proc = start_tuner(
        "run",
        str(spec),
        "--no-confirm",
        "--storage",
        sqlite_url,
        log=tmp_path / "run.log",
        env={"PYTHONPATH": f"{site}:{REPO}"},
    )
    try:
        assert proc.wait(timeout=180) == 0, (tmp_path / "run.log").read_text()[-3000:]  # on main: hung for ever
    finally:
        kill_tree(proc)
    ts = trials(sqlite_url, "tiny")
    assert [t.user_attrs.get("failure_class") for t in ts if t.state != TrialState.WAITING] == [J.INTERRUPTED]
    assert not [t for t in ts if t.state == TrialState.RUNNING]


def _lock_key(study: str) -> int:
    return int.from_bytes(hashlib.sha256(f"route-tuner:{study}".encode()).digest()[:8], "big", signed=True)


def _wait_for_lock_waiter(conn: psycopg2.extensions.connection, key: int, proc: subprocess.Popen[bytes]) -> None:
    """Block until another session waits for the study's advisory lock (which `conn` holds)."""
    deadline = time.monotonic() + 120
    with conn.cursor() as cur:
        while True:
            cur.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND classid = %s::oid AND objid = %s::oid AND objsubid = 1 "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
            )
            if cur.fetchone()[0]:
                return
            assert proc.poll() is None, "tuner run exited before it waited for the study lock"
            assert time.monotonic() < deadline, "nobody waited for the study lock"
            time.sleep(0.05)


def test_a_stop_during_reserve_runs_no_trial(write_spec, pg_url, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    spec = write_spec(
        **{"backend.name": FAULT, "backend.options": {"marker_dir": str(markers), "faults": {}}, "run.budget": 1}
    )
    run_study(spec, pg_url)
    builds = len(list(markers.glob("build-*")))
    key = _lock_key("tiny")
    holder = psycopg2.connect(pg_url)
    holder.autocommit = True
    proc = start_tuner("run", str(spec), "--no-confirm", "--storage", pg_url, "--trials", "2", log=tmp_path / "run.log")
    try:
        with holder.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(%s)", (key,))
            _wait_for_lock_waiter(holder, key, proc)  # `tuner run` itself, setting the study up
            cur.execute("SELECT pg_advisory_unlock(%s)", (key,))
            cur.execute("SELECT pg_advisory_lock(%s)", (key,))  # queued behind it: ours again once it is done
            _wait_for_lock_waiter(holder, key, proc)  # now the worker, in reserve
            (worker,) = [
                pid for pid, cmd, _ in processes() if b"tuner.worker.main" in cmd and str(spec).encode() in cmd
            ]
            os.kill(worker, signal.SIGTERM)
            cur.execute("SELECT pg_advisory_unlock(%s)", (key,))
        assert proc.wait(timeout=180) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        holder.close()
        kill_tree(proc)
    assert len(list(markers.glob("build-*"))) == builds  # no child was started for the reserved trial
    ts = trials(pg_url, "tiny")
    assert not [t for t in ts if t.state == TrialState.RUNNING]
    assert [t.user_attrs.get("failure_class") for t in ts if t.number == 1] == [J.INTERRUPTED]


# -- artifacts are checked -------------------------------------------------------------------


def test_an_artifact_outside_the_out_dir_is_refused(write_spec, sqlite_url, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    spec = write_spec(
        **{
            "backend.name": FAULT,
            "backend.options": {"marker_dir": str(markers), "faults": {"0": "outside"}},
            "run.budget": 1,
        }
    )
    run_study(spec, sqlite_url)
    (t,) = trials(sqlite_url, "tiny")
    assert t.state == TrialState.PRUNED and t.user_attrs["failure_class"] == J.BUILD_ERROR
    assert "outside its out dir" in t.user_attrs["message"] and "artifact_sha256" not in t.user_attrs
    assert list(markers.glob("outside-0*"))  # left where it was, not moved into the store


def test_export_refuses_an_artifact_changed_since_it_was_recorded(cli, write_spec, sqlite_url, tmp_path: Path) -> None:
    spec = write_spec(**{"run.budget": 1})
    run_study(spec, sqlite_url)
    (t,) = trials(sqlite_url, "tiny")
    (stored,) = (spec.parent / ".tuner" / "tiny" / "artifacts").glob(f"{t.user_attrs['artifact_sha256']}*")
    with open(stored, "ab") as f:
        f.write(b"tampered")
    result = cli(
        "best", str(spec), "--storage", sqlite_url, "--export", str(tmp_path / "out"), "--trial", str(t.number)
    )
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "changed since it was recorded" in result.stderr
    assert not list((tmp_path / "out").glob("engine*"))
