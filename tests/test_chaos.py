"""The chaos benchmark, short: every kind of fault once on a small study, then the same checks as bench/chaos.py.

A private PostgreSQL cluster (restarted for real), an outage through a TCP proxy, a full tmpfs work
dir, SIGKILLed workers and children, a SIGSTOPped worker. Needs root (tmpfs, runuser) and initdb.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from bench.chaos import PG_BIN, Seed

SHORT = ("kill_worker", "kill_child", "stop_worker", "pg_restart", "outage", "disk_full")


@pytest.mark.slow
@pytest.mark.skipif(not (PG_BIN / "initdb").exists() or not shutil.which("runuser"), reason="needs initdb and runuser")
def test_a_short_chaos_run_loses_nothing(own_timing_locks: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="chaos-test-") as d:  # pytest's tmp_path is not reachable for user postgres
        root = Path(d)
        root.chmod(0o755)
        seed = Seed(
            seed=7,
            outage_s=4.0,
            budget=14,
            workers=3,
            build_s=0.5,
            grace_s=4.0,
            root=root,
            schedule=SHORT,
            objective={"timing_cap_s": 0.5, "block_s": 0.002},
            first=(),
            last=(),
        )  # every route runs one model: a paired timing of equals would take the full cap; the timing's minimum
        # cycles are 2 ms blocks (the suite's studies' length) rather than 50 ms ones
        seed.setup()
        try:
            row = seed.run()
        finally:
            seed.teardown()
    assert row["faults_injected"] == len(SHORT), row["faults"]
    assert row["budget_exact"], row
    for key in (
        "trials_lost",
        "trials_left_running",
        "routes_built_twice",
        "concurrent_duplicate_builds",
        "orphans_after_run",
        "children_alive_5s_after_worker_kill",
        "cached_environment_errors",
    ):
        detail = {k: row[k] for k in ("lost", "duplicates", "overlapping_builds", "faults")}
        assert row[key] == 0, f"{key}: {json.dumps(detail, default=str)}"  # a string: pytest shows it whole
