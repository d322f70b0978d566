"""`tuner gc`: a dry run by default, then deletion of only what no kept trial, study or route needs."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import optuna
import psycopg2
from optuna.trial import TrialState

from tests.conftest import run_study
from tests.helpers import start_tuner, trial_dir, trials
from tuner.store.db import lock_key
from tuner.store.leases import HOST
from tuner.store.urls import normalize_url
from tuner.study import optuna_adapter as oa
from tuner.study.outcome import is_feasible


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def _artifact(work: Path, t: optuna.trial.FrozenTrial) -> list[Path]:
    sha = t.user_attrs.get("artifact_sha256")
    return list((work / "artifacts").glob(f"{sha}*")) if sha else []


def test_gc_lists_by_default_and_deletes_only_unneeded_files_with_yes(cli, write_spec, pg_url, tmp_path: Path) -> None:
    spec = write_spec(**{"run.budget": 10, "run.sampler": "random", "run.keep_best": 1, "run.racing": False})
    run_study(spec, pg_url)
    work = tmp_path / ".tuner" / "tiny"
    ts = sorted(trials(pg_url, "tiny"), key=lambda t: t.number)
    feasible = sorted((t for t in ts if is_feasible(t)), key=lambda t: (t.value, t.number))
    baseline = ts[0]
    taken = {baseline.user_attrs["artifact_sha256"], feasible[0].user_attrs["artifact_sha256"]}
    with_artifact = [
        t for t in reversed(feasible + ts) if t.user_attrs.get("artifact_sha256") not in taken | {None, ""}
    ]
    confirmed = with_artifact[0]  # a later-ranked trial that a confirmation measured
    study = optuna.load_study(study_name="tiny", storage=normalize_url(pg_url))
    study.set_user_attr(
        "confirmation",
        {
            "candidates": [{"trial": confirmed.number}],
            "trial": confirmed.number,  # as confirm stores it
            "message": "no significant speedup",
            "study_best_trial": feasible[0].number,
        },
    )
    kept = {baseline.number, feasible[0].number, confirmed.number}
    doomed = {p for t in ts if t.number not in kept for p in _artifact(work, t)} - {
        p for t in ts if t.number in kept for p in _artifact(work, t)
    }
    assert doomed  # the study left artifacts nobody needs

    before = _files(work)
    dry = cli("gc", str(spec), "--storage", pg_url)
    assert dry.returncode == 0, dry.stderr
    assert _files(work) == before  # a dry run removes nothing ...
    keeping = next(line for line in dry.stdout.splitlines() if line.startswith("keeping"))
    assert (
        f"#{baseline.number} baseline" in keeping
        and "best feasible #1" in keeping
        and f"#{confirmed.number} confirmed" in keeping
    )
    assert f"#{feasible[0].number} " in keeping and len(keeping.split("#")) - 1 >= 3
    for p in doomed:  # ... and lists each file with its size
        assert str(p.relative_to(work)) in dry.stdout
    assert "dry run: nothing was removed" in dry.stdout

    done = cli("gc", str(spec), "--storage", pg_url, "--yes")
    assert done.returncode == 0, done.stderr
    after = _files(work)
    assert not any(p.exists() for p in doomed)
    for t in ts:
        if t.number in kept:
            assert all(p.exists() for p in _artifact(work, t))
            assert (next((work / "trials").iterdir()) / f"{t.number:05d}" / "result.json").exists()
    untouched = ("variants/", "data/", "optuna-artifacts/")
    assert {k: v for k, v in before.items() if k.startswith(untouched)} == {
        k: v for k, v in after.items() if k.startswith(untouched)
    }
    assert any(k.startswith("variants/") for k in after)  # precision variants are kept for the routes still to come
    export = cli(
        "best", str(spec), "--storage", pg_url, "--export", str(tmp_path / "out"), "--trial", str(feasible[0].number)
    )
    assert export.returncode == 0, export.stderr
    again = cli("gc", str(spec), "--storage", pg_url)
    assert "would remove 0 item(s), 0 B" in again.stdout


def test_a_size_cap_collects_after_the_run_and_never_touches_a_running_study(
    cli, write_spec, pg_url, tmp_path: Path
) -> None:
    spec = write_spec(**{"run.budget": 6, "run.sampler": "random", "run.keep_best": 1, "run.max_disk_mb": 0.001})
    run = cli("run", str(spec), "--no-confirm", "--storage", pg_url)
    assert run.returncode == 0, run.stderr
    assert "gc: work dir" in run.stderr and "exceeds run.max_disk_mb (0.001 MB): removed" in run.stderr
    assert "what is kept is still" in run.stderr
    work = tmp_path / ".tuner" / "tiny"
    ts = trials(pg_url, "tiny")
    best = min((t for t in ts if is_feasible(t)), key=lambda t: (t.value, t.number))
    kept_shas = {t.user_attrs.get("artifact_sha256") for t in ts if t.number in (0, best.number)}
    assert {p.name[:64] for p in (work / "artifacts").iterdir()} == kept_shas
    # A trial RUNNING (a worker elsewhere): deleting is refused with one line.
    study = optuna.load_study(study_name="tiny", storage=normalize_url(pg_url))
    study._storage.create_new_trial(
        study._study_id, template_trial=optuna.trial.create_trial(state=TrialState.RUNNING, params={}, distributions={})
    )
    refused = cli("gc", str(spec), "--storage", pg_url, "--yes")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "1 RUNNING trial(s)" in refused.stderr


def _lock_waiters(conn: psycopg2.extensions.connection, key: int) -> int:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = %s AND objid = %s",
            ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
        )
        return int(cur.fetchone()[0])


def _advisory(conn: psycopg2.extensions.connection, verb: str, key: int) -> None:
    with conn.cursor() as cur:
        cur.execute(f"SELECT pg_advisory_{verb}(%s)", (key,))


def _reaped_lease(url: str, trial_id: int, host: str, pid: int, beat_s_ago: float) -> None:
    """The lease a reaper leaves on a trial whose worker stopped beating (the worker may still be alive)."""
    conn = psycopg2.connect(url)
    with conn, conn.cursor() as cur:
        cur.execute(
            "INSERT INTO tuner_leases (trial_id, study, worker, host, pid, heartbeat_at, state) VALUES "
            "(%s, 'tiny', 'w9', %s, %s, extract(epoch from clock_timestamp()) - %s, 'reaped') "
            "ON CONFLICT (trial_id) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid, "
            "heartbeat_at = EXCLUDED.heartbeat_at, state = 'reaped'",
            (trial_id, host, pid, beat_s_ago),
        )
    conn.close()


def test_gc_deletes_under_the_study_lock_and_never_what_racing_confirmation_or_a_live_child_uses(
    cli, write_spec, pg_url, tmp_path: Path
) -> None:
    spec = write_spec(
        **{
            "run.budget": 8,
            "run.sampler": "random",
            "run.keep_best": 1,
            "run.racing": False,
            "run.trial_timeout_s": 60.0,
            "run.grace_s": 30.0,
        }
    )
    run_study(spec, pg_url)
    work = tmp_path / ".tuner" / "tiny"
    study = optuna.load_study(study_name="tiny", storage=normalize_url(pg_url))
    ts = sorted(study.get_trials(), key=lambda t: t.number)
    best = min((t for t in ts if is_feasible(t)), key=lambda t: (t.value, t.number))
    folders = {t.number: trial_dir(pg_url, "tiny", work, t.number) for t in ts}
    raced, reaped_here, reaped_there, *rest = [
        t for t in ts if t.number not in (0, best.number) and folders[t.number].is_dir()
    ]
    assert rest, "the study needs folders nobody uses"
    study.set_user_attr("racing", {str(raced.number): {"claim": {"worker": "w1", "since": 0}}})  # being re-measured
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"]
    )  # a reaped worker still alive here
    _reaped_lease(pg_url, oa.trial_id(reaped_here), HOST, sleeper.pid, 300)
    _reaped_lease(pg_url, oa.trial_id(reaped_there), "another-host boot=x pidns=y", 1, 30)  # beat 30 s ago elsewhere
    before = _files(work)
    holder = psycopg2.connect(pg_url)
    holder.autocommit = True
    try:
        _advisory(holder, "lock", lock_key("route-tuner-confirm:tiny"))  # a confirmation is measuring
        busy = cli("gc", str(spec), "--storage", pg_url, "--yes")
        assert busy.returncode == 2 and "a confirmation of study 'tiny' is measuring" in busy.stderr, busy.stderr
        assert _files(work) == before
        _advisory(holder, "unlock", lock_key("route-tuner-confirm:tiny"))

        study_key = lock_key("route-tuner:tiny")
        _advisory(holder, "lock", study_key)  # a worker asking for a trial holds the study lock ...
        gc = start_tuner("gc", str(spec), "--storage", pg_url, "--yes", log=tmp_path / "gc.log")
        while _lock_waiters(holder, study_key) == 0:  # ... and gc waits for it
            assert gc.poll() is None, f"gc did not wait for the study lock: {(tmp_path / 'gc.log').read_text()}"
            time.sleep(0.05)  # polling the lock table for the waiter gc announces there
        asked = study._storage.create_new_trial(
            study._study_id,
            template_trial=optuna.trial.create_trial(state=TrialState.RUNNING, params={}, distributions={}),
        )  # what that worker asked for
        _advisory(holder, "unlock", study_key)
        assert (
            gc.wait(timeout=300) == 2 and "1 RUNNING trial(s)" in (tmp_path / "gc.log").read_text()
        )  # counted under the lock
        assert _files(work) == before
    finally:
        holder.close()
    study._storage.set_trial_state_values(asked, TrialState.FAIL)

    done = cli("gc", str(spec), "--storage", pg_url, "--yes")
    assert done.returncode == 0, done.stderr
    assert "#" + str(raced.number) + " being re-measured" in done.stdout
    assert all(folders[t.number].is_dir() for t in (ts[0], best, raced, reaped_here, reaped_there))
    assert not any(folders[t.number].exists() for t in rest)

    sleeper.kill()
    sleeper.wait()
    _reaped_lease(
        pg_url, oa.trial_id(reaped_there), "another-host boot=x pidns=y", 1, 2 * 60 + 30 + 1
    )  # past any child's life
    study.set_user_attr("racing", {})
    assert cli("gc", str(spec), "--storage", pg_url, "--yes").returncode == 0
    assert not any(folders[t.number].exists() for t in (raced, reaped_here, reaped_there))
    assert folders[0].is_dir() and folders[best.number].is_dir()
