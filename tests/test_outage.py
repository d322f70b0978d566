"""A database outage longer than the lease grace period, cut with a TCP proxy (the shared cluster
stays up): the workers wait it out with one status line each, keep their finished children's
results and record them when the database returns; nothing is reaped, lost, or built twice."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg2
from optuna.trial import TrialState

from tests.helpers import start_tuner, trial_dir, trials, wait_for_file
from tests.proxy import in_front_of
from tuner.space import canonical_route
from tuner.study import attrs as A

FAULT = "tests.backends:FaultBackend"


def _wait_for_stale_leases(url: str, count: int, older_than_s: float) -> None:
    """Block until `count` running leases have heartbeats older than `older_than_s` (database clock)."""
    conn = psycopg2.connect(url)  # straight to the cluster, not through the proxy
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            while True:
                cur.execute(
                    "SELECT count(*) FROM tuner_leases WHERE state = 'running' "
                    "AND extract(epoch from clock_timestamp()) - heartbeat_at > %s",
                    (older_than_s,),
                )
                if cur.fetchone()[0] >= count:
                    return
                time.sleep(0.1)
    finally:
        conn.close()


def _wait_for_final_result(path: Path, limit_s: float = 120) -> None:
    """Block until the child has written its final result (its status is no longer the start-up placeholder)."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            if json.loads(path.read_text())["status"] != "crash-exit":
                return
        except (OSError, ValueError):
            pass
        assert time.monotonic() < deadline, f"{path} holds no final result after {limit_s} s"
        time.sleep(0.05)


def test_an_outage_longer_than_the_grace_period_loses_nothing(
    write_spec, pg_url, tmp_path: Path, own_timing_locks: Path
) -> None:
    proxy, url = in_front_of(pg_url)
    markers = tmp_path / "markers"
    grace = 3.0
    spec = write_spec(
        **{
            "backend.name": FAULT,
            "backend.options": {"marker_dir": str(markers), "faults": {"default": "block"}},
            "run.budget": 4,
            "run.workers": 2,
            "run.heartbeat_s": 0.5,
            "run.grace_s": grace,
        }
    )
    proc = start_tuner("run", str(spec), "--no-confirm", "--storage", url, log=tmp_path / "run.log")
    try:
        wait_for_file(markers / "blocked-default", proc)  # the baseline's worker is inside its build ...
        _wait_for_stale_leases(pg_url, 2, -1.0)  # ... and the other holds trial 1, waiting for the baseline
        proxy.cut()
        _wait_for_stale_leases(pg_url, 2, grace + 1.0)  # every heartbeat is now past the grace period
        (markers / "release").write_text("")
        # The baseline's child finishes while the database is away (the other one is timed against the
        # baseline, so it waits for the baseline's engine, which is published once it is recorded).
        _wait_for_final_result(trial_dir(pg_url, "tiny", spec.parent / ".tuner" / "tiny", 0) / "result.json")
        proxy.restore()
        assert proc.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        proxy.cut()
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "run.log").read_text()
    for worker in (0, 1):
        lines = [line for line in log.splitlines() if line.startswith(f"[worker {worker}]") and "database" in line]
        assert len(lines) == 2 and "unreachable" in lines[0] and "back" in lines[1], lines
    ts = trials(pg_url, "tiny")
    assert not [t for t in ts if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    lost = [(t.number, t.user_attrs.get(A.MESSAGE)) for t in ts if t.user_attrs.get("failure_class") == "lost"]
    assert not lost, (lost, log[-3000:])
    assert sorted(t.number for t in ts if t.state.is_finished()) == [0, 1, 2, 3]
    # No route was built twice: one build per trial, but for a trial served from the cache (two workers that sample
    # at once may propose one route; the second is served the first one's result, not built again).
    built = [t for t in ts if not t.user_attrs.get("cache_hit")]
    trials_seen = [(t.number, t.state.name, t.params, t.user_attrs.get("failure_class")) for t in ts]
    assert len({canonical_route(t.params) for t in built}) == len(built), trials_seen
    assert len(list(markers.glob("build-*"))) == len(built), trials_seen
