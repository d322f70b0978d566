"""Helpers for tests that drive real processes: start the CLI in the background, wait for events, read studies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner.store.urls import normalize_url

REPO = Path(__file__).resolve().parents[1]


def start_tuner(*args: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start `tuner ARGS` in the background, output to `log` (`env` adds to or overrides the environment).

    SIGINT is reset to its default in the child: a test run started in the background by a
    non-interactive shell inherits SIGINT ignored, and Python then never installs its Ctrl-C handler.
    """
    with open(log, "wb") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "tuner", *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
            cwd=REPO,
            preexec_fn=_default_sigint,
        )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_file(path: Path, proc: subprocess.Popen[bytes] | None = None, limit_s: float = 120) -> None:
    """Block until `path` exists (an event the system under test announces); fail if `proc` exits first."""
    deadline = time.monotonic() + limit_s
    while not path.exists():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) before {path.name} appeared")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {limit_s} s")
        time.sleep(0.05)


def proc_stat(pid: int | str) -> list[str]:
    """The fields of /proc/PID/stat after the command name: [state, ppid, ...] (OSError if the process is gone)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (dead, not yet reaped by its parent)."""
    try:
        return proc_stat(pid)[0] != "Z"
    except OSError:
        return False


def trials(url: str, study: str) -> list[optuna.trial.FrozenTrial]:
    """All trials of a study, freshly read; the connections it opened are closed (tests poll with it). It only reads
    a study that exists: it neither creates tables nor checks the schema's version (most of a read's CPU)."""
    storage = optuna.storages.RDBStorage(normalize_url(url), skip_compatibility_check=True, skip_table_creation=True)
    try:
        return optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
    finally:
        storage.engine.dispose()


def status(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """Parse `tuner status --json` output."""
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def cli_in_process(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run the real `tuner` entry point in this process; its exit status and output as a CompletedProcess."""
    from tuner.cli.main import main

    monkeypatch.setattr(sys, "argv", ["tuner", *args])
    capsys.readouterr()
    code: int | str | None = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out.out, out.err)


def trial_dir(url: str, study: str, work_dir: Path, number: int) -> Path:
    """The folder of trial `number`: `work_dir/trials/<study id>/NNNNN` (the id is the study's, in `url`)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(normalize_url(url))
    with engine.connect() as conn:
        uid = conn.execute(text("SELECT uid FROM tuner_studies WHERE name = :n"), {"n": study}).scalar_one()
    engine.dispose()
    return work_dir / "trials" / uid[:12] / f"{number:05d}"


def all_rows_text(url: str) -> str:
    """Every row of every table in the database at `url`, as JSON text (to search for what must not be stored)."""
    from sqlalchemy import create_engine, inspect, text

    engine = create_engine(normalize_url(url))
    with engine.connect() as conn:
        dump = [
            json.dumps(conn.execute(text(f'SELECT json_agg(t) FROM "{name}" t')).scalar())
            for name in inspect(conn).get_table_names()
        ]
    engine.dispose()
    return "\n".join(dump)


def stuck_run(url: str, log: Path) -> str:
    """What a run that missed an expected event was doing, for the failure message: its log's last lines and every
    other session of its PostgreSQL database (state, what it waits for, who blocks it, its statement)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(normalize_url(url))
    with engine.connect() as conn:
        sessions = conn.execute(
            text(
                "SELECT pid, state, wait_event_type, wait_event, pg_blocking_pids(pid) AS blocked_by, "
                "round(extract(epoch from now() - state_change)) AS for_s, left(query, 160) AS query "
                "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).mappings()
        rows = "\n".join(json.dumps(dict(r), default=str) for r in sessions)
    engine.dispose()
    tail = log.read_text()[-3000:] if log.exists() else "(no log)"
    return f"log:\n{tail}\nsessions:\n{rows}"
