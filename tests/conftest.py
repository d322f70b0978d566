"""Shared fixtures: real PostgreSQL databases, SQLite files, small ONNX models, study files, the CLI."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from tests.helpers import cli_in_process
from tests.models import conv_model
from tuner.spec.toml import dumps

PG_ADMIN = os.environ.get("TUNER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REPO = Path(__file__).resolve().parents[1]


def _admin() -> Any:
    conn = psycopg2.connect(PG_ADMIN)
    conn.autocommit = True
    return conn


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that read the test run's recorded landscape run in one pytest-xdist worker (it is recorded once there)."""
    for item in items:
        if "recorded" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("recorded"))


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder this test run's processes share: pytest's base temp, above the per-worker ones under pytest-xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


# How the suite's studies time the tiny model ([objective]): briefly, and beside the other tests. The suite runs on
# shared, busy machines: contention is recorded, not acted on (tests of "exclusive" set it).
BRIEF_TIMING: dict[str, Any] = {
    "warmup_s": 0.0,
    "min_repeats": 5,
    "min_duration_s": 0.02,
    "block_s": 0.002,
    "timing_cap_s": 0.1,  # the tiny model takes microseconds: 0.1 s is thousands of calls per engine
    "target_halfwidth": 0.1,
    "contention": "shared",
}


@pytest.fixture(autouse=True)
def no_outage_from_an_earlier_test() -> None:
    """Each test starts with this process's view of the database clear (`tuner.store.db.OUTAGE`): an outage an
    earlier test caused with in-process workers must not make this test's reaper distrust every heartbeat."""
    import math

    from tuner.store.db import OUTAGE

    OUTAGE.since, OUTAGE.ended_at = None, -math.inf


@pytest.fixture(autouse=True, scope="session")
def private_timing_locks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Timing locks private to this test run (tuner.measure.exclusive), inherited by every process it starts.

    Trials of one run exclude each other, in every pytest-xdist worker, as trials on one host do; other
    runs and studies on this host do not hold up its trials (a test's short trial timeout would count
    their timings as its own).
    """
    from tuner.measure.exclusive import LOCK_DIR_ENV

    directory = run_root(tmp_path_factory) / "timing-locks"
    directory.mkdir(exist_ok=True)
    previous = os.environ.get(LOCK_DIR_ENV)
    os.environ[LOCK_DIR_ENV] = str(directory)
    yield directory
    if previous is None:
        os.environ.pop(LOCK_DIR_ENV, None)
    else:
        os.environ[LOCK_DIR_ENV] = previous


@pytest.fixture
def own_timing_locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Timing locks of this test alone, as if its study ran on a host of its own.

    For tests that freeze or cut off lock holders on purpose (a SIGSTOPped worker, a database outage
    while a worker records): with the run's shared locks such a holder would hold up the trials of
    every test beside it, and theirs would hold up this test's protocol.
    """
    from tuner.measure.exclusive import LOCK_DIR_ENV

    directory = tmp_path / "timing-locks"
    directory.mkdir()
    monkeypatch.setenv(LOCK_DIR_ENV, str(directory))
    return directory


@pytest.fixture
def pg_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The PostgreSQL cluster for one test: shared with the tests beside it (pytest-xdist), or the test's alone
    if it is marked `restarts_postgres` (it waits until no other test uses the cluster, and they wait for it)."""
    with open(run_root(tmp_path_factory) / "pg-cluster.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if request.node.get_closest_marker("restarts_postgres") else fcntl.LOCK_SH)
        yield


@pytest.fixture
def pg_url(pg_cluster: None) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test (dropped afterwards)."""
    name = f"tuner_test_{uuid.uuid4().hex[:12]}"
    conn = _admin()
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    base = PG_ADMIN.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    conn = _admin()
    with conn.cursor() as cur:
        cur.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
    conn.close()


@pytest.fixture(scope="session")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny study's 6-route landscape (real ONNX Runtime builds in real children), recorded once per session.

    Shared by the landscape and replay tests, which only read it: (study file, landscape file).
    """
    from tests.test_landscape import record_tiny_landscape

    return record_tiny_landscape(tmp_path_factory.mktemp("landscape"))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite database file in the test's temporary directory."""
    return f"sqlite:///{tmp_path / 'study.db'}"


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    """A small real CNN (input x [1,3,16,16], output y [1,10])."""
    return conv_model(tmp_path / "tiny.onnx")


SpecWriter = Callable[..., Path]


@pytest.fixture
def write_spec(tmp_path: Path, tiny_model: Path) -> SpecWriter:
    """Write a study file for the tiny model; keyword arguments override `section.key` values.

    Example: write_spec(**{"run.budget": 4, "backend.space": {"precision": ["fp32"]}}).
    """

    def write(name: str = "study.toml", **overrides: Any) -> Path:
        doc: dict[str, dict[str, Any]] = {
            "study": {"name": "tiny"},
            "model": {"path": str(tiny_model)},
            "data": {"samples": 4, "gate_samples": 2},
            "accuracy": {"metric": "cosine", "tolerance": 0.001},
            "objective": dict(BRIEF_TIMING),
            "backend": {"name": "onnxruntime"},
            "run": {"budget": 4, "heartbeat_s": 0.5, "grace_s": 30.0, "trial_timeout_s": 120.0},
        }
        for dotted, value in overrides.items():
            section, _, key = dotted.partition(".")
            if value is None:
                doc.setdefault(section, {}).pop(key, None)
            else:
                doc.setdefault(section, {})[key] = value
        path = tmp_path / name
        path.write_text(dumps(doc))
        return path

    return write


def run_study(spec: Path, storage: str | None = None, trials: int | None = None, **options: Any) -> dict[str, Any]:
    """Run the study in this process through the Python API, as `tuner run SPEC --no-confirm` does (`tuner run` is
    built on `Study.run`; `options` are its keyword arguments, e.g. `confirm=True, confirm_rounds=6`): for tests that
    need a run's results, not the command's output. Its workers are real processes, forked from the real server."""
    from tuner import Study

    return Study.from_file(spec, storage=storage).run(trials, confirm=options.pop("confirm", False), **options)


def tuner(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real `tuner` CLI in a subprocess and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO)},
        cwd=cwd or REPO,
    )


Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    """The real `tuner` entry point run in this process, as `tuner(...)` runs it in a new one: its exit status and
    output as a CompletedProcess; `env` adds to the environment, `cwd` is the folder it runs in. For commands that
    read and print (`best`, `status`, `trials`, ...): a new process spends about a second of CPU starting up."""

    def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        with monkeypatch.context() as scoped:
            for name, value in (env or {}).items():
                scoped.setenv(name, value)
            scoped.chdir(cwd or REPO)
            return cli_in_process(capsys, scoped, *args)

    return run
