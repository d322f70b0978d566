"""A frozen PostgreSQL (every process of its cluster SIGSTOPped: it accepts TCP, answers keepalives and never
replies) does not hang `tuner run`: a SIGTERM ends it within 15 s. A private cluster of the test's own (the shared
one is never stopped); needs the PostgreSQL server binaries and runuser."""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from bench.chaos import PG_BIN, SIGTERM_LIMIT_S, PrivateCluster, signal_each
from tests.conftest import SpecWriter
from tests.helpers import start_tuner, trial_dir, wait_for_file

FAULT = "tests.backends:FaultBackend"


def _final(path: Path) -> bool:
    try:
        return json.loads(path.read_text())["status"] != "crash-exit"  # not the start-up placeholder
    except (OSError, ValueError):
        return False


@pytest.mark.skipif(
    not (PG_BIN / "initdb").exists() or not shutil.which("runuser"),
    reason="needs initdb and pg_ctl (PostgreSQL server binaries) and runuser, to start a private cluster",
)
def test_sigterm_ends_tuner_run_within_15_s_while_the_database_is_frozen(
    write_spec: SpecWriter, tmp_path: Path, own_timing_locks: Path
) -> None:
    from tests.test_lifecycle import _until

    with tempfile.TemporaryDirectory(prefix="frozen-db-") as d:  # pytest's tmp_path is not reachable for postgres
        root = Path(d)
        root.chmod(0o755)
        cluster = PrivateCluster(root)
        cluster.start()
        try:
            cluster.create("frozen")
            url = cluster.url("frozen")
            markers = tmp_path / "markers"
            spec = write_spec(
                **{
                    "backend.name": FAULT,
                    "backend.options": {"marker_dir": str(markers), "faults": {"0": "block"}},
                    "run.budget": 3,
                    "run.heartbeat_s": 0.5,
                }
            )
            proc = start_tuner("run", str(spec), "--no-confirm", "--storage", url, log=tmp_path / "run.log")
            try:
                wait_for_file(markers / "blocked-0", proc)
                result = trial_dir(url, "tiny", spec.parent / ".tuner" / "tiny", 0) / "result.json"
                frozen = signal_each(cluster.pids(), signal.SIGSTOP)
                try:
                    (markers / "release").touch()
                    _until(lambda: _final(result), "the child's result", proc=proc)  # the worker records it: waits
                    proc.send_signal(signal.SIGTERM)
                    assert proc.wait(timeout=SIGTERM_LIMIT_S) == 130, (tmp_path / "run.log").read_text()[-3000:]
                finally:
                    signal_each(frozen, signal.SIGCONT)
            finally:
                if proc.poll() is None:
                    proc.kill()
            log = (tmp_path / "run.log").read_text()
            assert "the database did not answer" in log and "Traceback" not in log, log[-3000:]
        finally:
            cluster.stop()
