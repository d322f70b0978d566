"""CLI conventions: help and version, JSON everywhere, exit statuses, progress lines, no repeated or stray work."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tests.conftest import tuner
from tests.helpers import trials
from tuner import __version__
from tuner.cli.common import latency_line
from tuner.cli.results import pair_ms
from tuner.events import TrialWatcher

FAULT = "tests.backends:FaultBackend"
FP32 = {"precision": ["fp32"]}
TWO_ROUTES = {"precision": ["fp32"], "intra_op_threads": [0, 1]}
SAME_SPEED = {  # two routes that differ only in the memory arena: both feasible, neither clearly slower
    "precision": ["fp32"],
    "graph_optimization_level": ["all"],
    "execution_mode": ["sequential"],
    "intra_op_threads": [0],
    "cpu_mem_arena": [True, False],
    "mem_pattern": [True],
}


def test_help_and_version(cli) -> None:
    for args in (["-h"], ["--help"], ["run", "-h"], ["trials", "-h"]):
        shown = cli(*args)
        assert shown.returncode == 0 and "Usage" in shown.stdout, (args, shown.stderr)
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"route-tuner {__version__}"


def test_the_latency_line_leaves_out_what_was_not_measured() -> None:
    both = {"trial": 3, "measured_ms": {"trial": 0.026}, "default_ms": 0.0264}
    assert latency_line(both) == "  trial 3: 0.026 ms in the study, default route 0.026 ms"
    unpaired = {"trial": 1, "measured_ms": None, "default_ms": None}  # e.g. --no-confirm with no baseline figure
    assert latency_line(unpaired) == "  trial 1: no latency measured in the study"


def test_the_latency_line_shows_both_engines_from_one_measurement() -> None:
    """The default's figure comes from the measurement the trial's came from, not from the study as a whole: a
    study-wide median taken while the machine ran faster or slower would contradict the speedup beside it."""
    paired = {"trial": 5, "measured_ms": {"trial": 4.246, "default": 4.21}, "default_ms": 4.966}
    assert latency_line(paired) == "  trial 5: 4.246 ms in the study, default route 4.210 ms beside it"
    row = {"trial": 5, "median_ms": 4.488, "default_median_ms": 4.382, "processes": 5}
    confirmed = {**paired, "confirmation": {"candidates": [{"trial": 4, "median_ms": 1.0}, row]}}
    assert latency_line(confirmed) == (
        "  trial 5: 4.488 ms, default route 4.382 ms (medians of the confirmation's 5 paired processes)"
    )
    failed = {**paired, "confirmation": {"candidates": [{"trial": 5, "failure": "no uncontended measurement"}]}}
    assert latency_line(failed) == latency_line(paired)


def test_a_trials_milliseconds_are_measured_with_the_default_timed_beside_it() -> None:
    row = {"latency_ms": 4.246, "default_ms": 4.21, "changes": {"mem_pattern": False}}
    assert pair_ms(row) == "4.246 (4.210)"
    assert pair_ms({**row, "changes": {}}) == "4.246"  # the default route itself
    assert pair_ms({**row, "latency_ms": None}) == "-"  # contended, or never timed


def test_trials_that_finish_between_two_looks_each_show_their_own_count() -> None:
    study = optuna.create_study()
    watcher = TrialWatcher(study, budget=3)
    for x in (1.0, 2.0):
        study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=x))
    assert [(e.number, e.done) for e in watcher.poll()] == [(0, 1), (1, 2)]
    assert watcher.poll() == []


def test_progress_is_one_line_per_trial_without_a_terminal_and_trials_lists_them(cli, write_spec, sqlite_url) -> None:
    spec = write_spec(**{"run.budget": 3, "backend.space": TWO_ROUTES})
    run = cli("run", str(spec), "--storage", sqlite_url, "--no-confirm")  # stderr is captured, not a terminal
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith("trial ")]
    assert [line.split()[1] for line in lines] == ["0", "1", "2"], run.stderr
    assert lines[0].startswith("trial 0 [default route]: feasible") and "(1/3" in lines[0], lines[0]
    assert all("\x1b" not in line for line in run.stderr.splitlines())  # no terminal codes in a log
    rows = json.loads(cli("trials", str(spec), "--storage", sqlite_url, "--json").stdout)
    assert [r["number"] for r in rows] == [0, 1, 2] and rows[0]["outcome"] == "feasible"
    assert set(rows[0]) >= {"state", "outcome", "route", "changes", "value", "speedup", "message"}
    failed = json.loads(cli("trials", str(spec), "--storage", sqlite_url, "--json", "--failed").stdout)
    assert [r["number"] for r in failed] == [r["number"] for r in rows if r["outcome"] != "feasible"]
    plan = json.loads(cli("gc", str(spec), "--storage", sqlite_url, "--json").stdout)
    assert plan["study"] == "tiny" and plan["removed"] is False and "0" in plan["kept"]
    more = cli("run", str(spec), "--storage", sqlite_url, "--no-confirm", "--trials", "4", "--log-format", "json")
    assert more.returncode == 0, more.stderr
    events = [json.loads(line) for line in more.stderr.splitlines() if line.startswith("{")]
    assert [e["number"] for e in events if e["event"] == "trial"] == [3]  # only what this run finished
    assert {e["event"] for e in events} == {"trial", "phase"}


def test_a_second_run_of_a_confirmed_study_does_not_confirm_again(cli, write_spec, sqlite_url) -> None:
    spec = write_spec(**{"run.budget": 2, "run.racing": False, "backend.space": SAME_SPEED})
    args = ("run", str(spec), "--storage", sqlite_url, "--confirm-top-k", "1", "--confirm-rounds", "3")
    first = cli(*args)
    assert first.returncode == 0, first.stderr
    assert "confirm round 1/3" in first.stderr, first.stderr  # the confirmation shows its rounds
    confirmed = json.loads(cli("best", str(spec), "--storage", sqlite_url, "--json").stdout)["confirmation"]
    status = json.loads(cli("status", str(spec), "--storage", sqlite_url, "--json").stdout)
    assert status["confirm_s"] > 0 and status["elapsed_s"] >= status["confirm_s"]  # counted in the elapsed time
    again = cli(*args, "--json")
    assert again.returncode == 0, again.stderr
    assert "confirm round" not in again.stderr and "stored confirmation holds" in again.stderr, again.stderr
    assert json.loads(again.stdout)["confirmation"]["id"] == confirmed["id"]
    forced = cli(*args, "--reconfirm", "--json")
    assert forced.returncode == 0 and "confirm round 1/3" in forced.stderr, forced.stderr
    assert json.loads(forced.stdout)["confirmation"]["id"] != confirmed["id"]


def test_read_only_commands_leave_no_file_behind(cli, write_spec, tmp_path: Path) -> None:
    spec = write_spec(**{"backend.space": {"precision": ["fp32", "int8_static"]}})  # int8: a prepared model
    before = sorted(tmp_path.rglob("*"))
    listed = cli("space", str(spec), "--json")
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    assert doc["routes"] > 1 and doc["preparation"], doc
    for command in ("status", "best", "trials"):
        refused = cli(command, str(spec), "--json")
        assert refused.returncode == 2 and "does not exist" in json.loads(refused.stdout)["error"]
    assert sorted(tmp_path.rglob("*")) == before


def test_exit_statuses_bad_input_2_no_speedup_4(cli, write_spec, sqlite_url, tmp_path: Path) -> None:
    bad = cli("run", str(write_spec("bad.toml", **{"run.budget": 0})), "--json")
    assert bad.returncode == 2 and json.loads(bad.stdout) == {"error": bad.stderr.strip()[7:], "exit_code": 2}
    spec = write_spec(**{"run.budget": 1, "backend.space": FP32})
    assert cli("run", str(spec), "--log-format", "xml").returncode == 2
    done = cli("run", str(spec), "--storage", sqlite_url, "--no-confirm", "--fail-if-no-speedup")
    assert done.returncode == 4, done.stderr  # unconfirmed is not a speedup


def test_a_timeout_interrupts_the_trial_in_flight_requeues_it_and_ends_with_a_verdict(
    write_spec, sqlite_url, tmp_path: Path, own_timing_locks: Path
) -> None:
    # Timing locks of its own: the blocked build holds the host's lock shared for the whole minute, which would
    # hold up every other test's timings (and, queued behind those, their trials' starts) as long.
    markers = tmp_path / "markers"
    options = {"marker_dir": str(markers), "faults": {"0": "block"}}  # the first build blocks until released: never
    # The cap counts from the command's start: about 5 s pass before trial 0 builds on a quiet host, and over 20 s
    # have passed on a loaded two-core one; the cap leaves room for that and the blocked build waits it out.
    spec = write_spec(**{"backend.name": FAULT, "backend.options": options, "run.budget": 2, "run.timeout_s": 60.0})
    capped = tuner("run", str(spec), "--storage", sqlite_url)
    assert capped.returncode == 0, capped.stderr
    assert "timeout: 60 s passed; the trials in flight are re-queued" in capped.stderr
    assert (markers / "blocked-0").exists()  # the cap came while trial 0 was building
    assert "confirming" not in capped.stderr and capped.stdout.strip(), capped.stdout  # a verdict, unconfirmed
    ts = trials(sqlite_url, "tiny")
    assert not [t for t in ts if t.state == TrialState.RUNNING]
    assert [t.number for t in ts if t.user_attrs.get("failure_class") == "interrupted"] == [0]
    assert 0 in [t.user_attrs.get("retry_of") for t in ts if t.state == TrialState.WAITING]  # asked again


def test_db_upgrade_reports_in_json(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db' / 'study.db'}"
    done = tuner("db", "upgrade", "--storage", url, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["storage"] == url and doc["tuner_schema"][0] is None and doc["tuner_schema"][1]
    again = json.loads(tuner("db", "upgrade", "--storage", url, "--json").stdout)
    assert again["tuner_schema"] == [doc["tuner_schema"][1]] * 2  # an upgraded database stays as it is
