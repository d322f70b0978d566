"""Trial children forked from a pre-imported server (tuner.worker.forkserver): the same isolation as a fresh one.

Real processes and real signals: the server is a real `python -m tuner.worker.child --serve`, the
children real forks of it running real ONNX Runtime; every wait is for an announced event.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import REPO, SpecWriter
from tests.helpers import running, start_tuner, wait_for_file
from tuner import job as J
from tuner.backends.onnxruntime import OnnxRuntimeBackend
from tuner.spec import load_spec
from tuner.study.setup import Context
from tuner.worker import forkserver
from tuner.worker.isolate import child_env, run_isolated
from tuner.worker.jobs import make_job

FAULT = "tests.backends:FaultBackend"


def _context(write_spec: SpecWriter, tmp_path: Path, **overrides: object) -> Context:
    return Context(load_spec(write_spec(**overrides)), f"sqlite:///{tmp_path / 'x.db'}")


def _serving(job: J.Job) -> forkserver.ForkServer:
    """The server this process forks `job`'s child from."""
    server = forkserver.server_for(job.preload or (), child_env())
    assert isinstance(server, forkserver.ForkServer)
    return server


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_cpu_trials_are_forked_from_one_server_and_gpu_routes_are_not(write_spec: SpecWriter, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    ctx = _context(
        write_spec, tmp_path, **{"backend.name": FAULT, "backend.options": {"marker_dir": str(markers), "faults": {}}}
    )
    route = ctx.space.default_route()
    job = make_job(ctx, route, tmp_path / "a" / "out")
    assert job.preload is not None and job.preload[0] == "tests.backends"
    assert OnnxRuntimeBackend().fork_safe({**route, "provider": "cuda"}, {}) is False  # a GPU route: a fresh process
    first = run_isolated(job, tmp_path / "a")
    second = run_isolated(make_job(ctx, route, tmp_path / "b" / "out"), tmp_path / "b")
    assert first.status == second.status == J.OK, (first.message, second.message)
    server = _serving(job)  # (earlier tests in this process may have their own)
    assert server.alive() and server.proc.args[:4] == [sys.executable, "-m", "tuner.worker.child", "--serve"]


def test_a_library_s_variable_in_the_worker_keeps_its_server_and_another_change_replaces_it(
    write_spec: SpecWriter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """scikit-learn (the local search's first fit) sets KMP_INIT_AT_FORK in the worker mid-study: no new server."""
    import sklearn  # noqa: F401

    assert "KMP_INIT_AT_FORK" in os.environ and "KMP_INIT_AT_FORK" in forkserver.STARTER_LIBRARY_ENV
    markers = tmp_path / "markers"
    ctx = _context(
        write_spec, tmp_path, **{"backend.name": FAULT, "backend.options": {"marker_dir": str(markers), "faults": {}}}
    )
    route = ctx.space.default_route()

    def run(name: str) -> forkserver.ForkServer:
        job = make_job(ctx, route, tmp_path / name / "out")
        assert run_isolated(job, tmp_path / name).status == J.OK
        return _serving(job)

    monkeypatch.setenv("TUNER_TEST_SETTING", "0")  # not a server an earlier test in this process left
    monkeypatch.delenv("KMP_INIT_AT_FORK")
    first = run("a")
    monkeypatch.setenv("KMP_INIT_AT_FORK", "FALSE")
    assert run("b") is first and first.alive()
    monkeypatch.setenv("TUNER_TEST_SETTING", "1")  # any other change: the server is started again with it
    replaced = run("c")
    assert replaced is not first and not first.alive() and replaced.env["TUNER_TEST_SETTING"] == "1"


def test_a_study_s_server_also_forks_trial_children_that_need_fewer_modules(
    write_spec: SpecWriter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    markers = tmp_path / "markers"
    ctx = _context(
        write_spec, tmp_path, **{"backend.name": FAULT, "backend.options": {"marker_dir": str(markers), "faults": {}}}
    )
    job = make_job(ctx, ctx.space.default_route(), tmp_path / "a" / "out")
    monkeypatch.setenv("TUNER_TEST_SETTING", "0")  # not a server an earlier test in this process left
    study = forkserver.server_for([forkserver.WORKER_MODULE, *(job.preload or ())], child_env())
    servers = dict(forkserver._SERVERS)
    assert run_isolated(job, tmp_path / "a").status == J.OK
    assert forkserver._SERVERS == servers and _serving(job) is study and study.alive()  # no server started for it
    monkeypatch.setenv("TUNER_TEST_SETTING", "1")  # another environment: not that server's
    assert run_isolated(make_job(ctx, ctx.space.default_route(), tmp_path / "b" / "out"), tmp_path / "b").status == J.OK
    assert _serving(job) is not study and forkserver._SERVERS[tuple(job.preload or ())] is _serving(job)


def test_a_forked_child_looks_like_a_fresh_one_and_dies_with_its_server(write_spec: SpecWriter, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    ctx = _context(
        write_spec,
        tmp_path,
        **{"backend.name": FAULT, "backend.options": {"marker_dir": str(markers), "faults": {"0": "orphan"}}},
    )
    job = make_job(ctx, ctx.space.default_route(), tmp_path / "t" / "out")
    results: list[J.Result] = []
    import threading

    runner = threading.Thread(target=lambda: results.append(run_isolated(job, tmp_path / "t")))
    runner.start()
    wait_for_file(markers / "orphan-0", None)
    child, worker = map(int, (markers / "orphan-0").read_text().split())
    server = _serving(job)
    assert worker == os.getpid() and _parent_of(child) == server.proc.pid != os.getpid()
    cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
    assert b"tuner.worker.child" in cmdline and str(tmp_path / "t" / "job.json").encode() in cmdline
    assert os.getpgid(child) == child  # its own process group: a timeout kills the whole group
    environ = Path(f"/proc/{child}/environ").read_bytes() + Path(f"/proc/{server.proc.pid}/environ").read_bytes()
    assert b"TUNER_STORAGE" not in environ
    os.kill(server.proc.pid, signal.SIGKILL)
    runner.join(timeout=60)
    assert results and results[0].status == J.ENVIRONMENT_ERROR, results  # SIGKILL from outside
    assert "SIGKILL" in results[0].message
    deadline = time.monotonic() + 5.0
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists(), "the forked child outlived its server"
    again = run_isolated(
        make_job(ctx, ctx.space.default_route(), tmp_path / "u" / "out"), tmp_path / "u"
    )  # a new server
    assert again.status == J.OK, again.message


STARTER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from tuner import job as J
    from tuner.worker.isolate import run_isolated
    run_isolated(J.Job.read(Path(sys.argv[1])), Path(sys.argv[2]))
""")


def test_the_forked_child_of_a_sigkilled_worker_is_gone_within_5_s(write_spec: SpecWriter, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    ctx = _context(
        write_spec,
        tmp_path,
        **{"backend.name": FAULT, "backend.options": {"marker_dir": str(markers), "faults": {"0": "orphan"}}},
    )
    job = make_job(ctx, ctx.space.default_route(), tmp_path / "t" / "out")
    ctx.reference_path  # noqa: B018 - computed here, not in the starter
    job.write(tmp_path / "job.json")
    worker = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(tmp_path / "job.json"), str(tmp_path / "t")],
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    child = 0
    try:
        wait_for_file(markers / "orphan-0", worker)
        child, starter = map(int, (markers / "orphan-0").read_text().split())
        server = _parent_of(child)
        assert starter == worker.pid and _parent_of(server) == worker.pid  # the child's parent is the worker's server
        worker.kill()
        worker.wait()
        deadline = time.monotonic() + 5.0
        while (running(child) or running(server)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(child), "the forked child outlived its SIGKILLed worker by 5 s"
        assert not running(server), "the fork server outlived its SIGKILLed worker by 5 s"
    finally:
        if worker.poll() is None:
            worker.kill()
        if child and Path(f"/proc/{child}").exists():
            os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize("fault, status", [("segfault", J.CRASH_SIGNAL), ("hang", J.TIMEOUT)])
def test_crashes_and_hangs_of_a_forked_child_are_classified_as_before(
    fault: str, status: str, write_spec: SpecWriter, tmp_path: Path
) -> None:
    markers = tmp_path / "markers"
    ctx = _context(
        write_spec,
        tmp_path,
        **{"backend.name": FAULT, "backend.options": {"marker_dir": str(markers), "faults": {"0": fault}}},
    )
    job = make_job(ctx, ctx.space.default_route(), tmp_path / "t" / "out")
    job = replace(job, timeout_s=3.0) if fault == "hang" else job  # the reference above ran with the study's timeout
    assert job.preload is not None
    res = run_isolated(job, tmp_path / "t")
    assert res.status == status, res.message
    assert ("SIGSEGV" in res.message) if fault == "segfault" else ("no result after 3 s (during build)" in res.message)


@pytest.mark.parametrize("forked", [True, False], ids=["study-server", "fresh-interpreters"])
def test_a_runs_workers_come_from_its_server_and_a_sigkilled_ones_child_is_gone_within_5_s(
    forked: bool, write_spec: SpecWriter, sqlite_url: str, tmp_path: Path
) -> None:
    """`tuner run` forks its CPU workers, and they their trials' children, from one server of the run's own
    ($TUNER_FORK_SERVER=0: fresh interpreters, each child the worker's); either way a SIGKILLed worker's child is
    killed with it, the run says a worker died and leaves no process behind."""
    markers = tmp_path / "markers"
    spec = write_spec(
        **{"backend.name": FAULT, "backend.options": {"marker_dir": str(markers), "faults": {"0": "orphan"}}}
    )
    env = {} if forked else {forkserver.ENABLE_ENV: "0"}
    proc = start_tuner("run", str(spec), "--no-confirm", "--storage", sqlite_url, log=tmp_path / "run.log", env=env)
    child = 0
    try:
        wait_for_file(markers / "orphan-0", proc)
        child, worker = map(int, (markers / "orphan-0").read_text().split())
        assert b"tuner.worker.main" in Path(f"/proc/{worker}/cmdline").read_bytes()
        server = _parent_of(worker)
        if forked:
            assert server != proc.pid and _parent_of(server) == proc.pid and _parent_of(child) == server
            assert b"--serve" in Path(f"/proc/{server}/cmdline").read_bytes()
        else:
            assert server == proc.pid and _parent_of(child) == worker
        os.kill(worker, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(child), "the trial's child outlived its SIGKILLed worker by 5 s"
        assert proc.wait(timeout=120) == 3, (tmp_path / "run.log").read_text()[-3000:]
        assert not running(server) or server == proc.pid, "the run's server outlived it"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if child and running(child):
            os.kill(child, signal.SIGKILL)
