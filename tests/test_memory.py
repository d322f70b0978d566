"""Peak memory while an engine loads and runs (`tuner.measure.memory`), read for real, and `[objective]
max_memory_mb`."""

from __future__ import annotations

import json
import subprocess
import sys

from optuna.trial import TrialState

from tests.conftest import run_study
from tests.helpers import trials
from tuner.measure.memory import DEVICE, HOST, MemoryProbe


def test_the_probe_reports_what_was_allocated_after_it_started_even_once_freed() -> None:
    kept = bytearray(96 << 20)  # resident before the probe started: not counted
    probe = MemoryProbe.start()
    block = bytearray(64 << 20)  # 64 MiB, written (zero-filled), so resident
    del block
    peak, kind = probe.peak(gpu=False)
    assert kind == HOST and peak is not None and 60 <= peak < 96, peak
    assert len(kept) == 96 << 20


def test_without_a_cuda_context_device_memory_is_unknown_not_zero() -> None:
    assert MemoryProbe.start().peak(gpu=True) == (None, DEVICE)


def test_a_process_without_the_cuda_driver_loaded_is_not_made_to_import_cuda_python() -> None:
    probe = (
        "import sys\n"
        "from tuner.measure.memory import MemoryProbe\n"
        "assert MemoryProbe.start().device_start is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('cuda')))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout  # a CPU trial's child: no cuda-python import on its start


def test_a_memory_cap_makes_routes_above_it_infeasible_and_the_sampler_sees_it(cli, write_spec, sqlite_url) -> None:
    spec = write_spec(
        **{
            "backend.name": "tests.backends:BallastBackend",
            "objective.max_memory_mb": 24.0,
            "run.budget": 3,
            "run.racing": False,
        }
    )
    run_study(spec, sqlite_url)
    done = {t.params["ballast_mb"]: t for t in trials(sqlite_url, "tiny")}
    assert set(done) == {0, 48, 96} and all(t.state == TrialState.COMPLETE for t in done.values())
    assert (
        done[0].user_attrs["peak_memory_mb"] < 24
        and done[0].constraints["memory"] <= 0
        and done[0].user_attrs["feasible"]
    )
    for heavy in (48, 96):  # timed and accurate, but over the cap: infeasible through the constraint TPE and GP read
        t = done[heavy]
        assert t.user_attrs["peak_memory_mb"] >= heavy and t.constraints["memory"] > 0 and not t.user_attrs["feasible"]
        assert t.constraints["accuracy"] <= 0 and t.constraints["failure"] < 0
    best = json.loads(cli("best", str(spec), "--storage", sqlite_url, "--json").stdout)
    assert best["trial"] == done[0].number and best["peak_memory_mb"] == done[0].user_attrs["peak_memory_mb"]
    assert best["artifact_bytes"] == done[0].user_attrs["artifact_bytes"] > 0


def test_a_cap_below_the_default_routes_peak_leaves_no_feasible_route(cli, write_spec, sqlite_url) -> None:
    spec = write_spec(
        **{
            "backend.name": "tests.backends:BallastBackend",
            "objective.max_memory_mb": 0.001,
            "run.budget": 2,
            "run.racing": False,
        }
    )
    run_study(spec, sqlite_url)
    done = trials(sqlite_url, "tiny")
    baseline = next(t for t in done if t.user_attrs.get("source") == "baseline")
    assert (
        baseline.user_attrs["peak_memory_mb"] > 0.001
        and baseline.constraints["memory"] > 0
        and not baseline.user_attrs["feasible"]
    )
    assert all(not t.user_attrs["feasible"] for t in done)
    best = cli("best", str(spec), "--storage", sqlite_url)
    assert best.returncode == 2 and "no feasible trial" in best.stderr
