"""`tuner dashboard`: what a user sees in optuna-dashboard for a finished study, in real headless Chromium.

Needs Debian's `chromium` (/usr/bin/chromium; `make test-deps` installs it) and Playwright for Python,
driving that browser: `playwright install` is never run.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna_dashboard import get_note
from playwright.sync_api import Page, expect, sync_playwright
from sqlalchemy import create_engine, inspect, text

from tests.conftest import REPO, SpecWriter, run_study, tuner
from tests.helpers import start_tuner
from tuner.cli.dashboard import FeasibleBestStorage, is_loopback
from tuner.store.urls import normalize_url
from tuner.study import optuna_adapter as oa
from tuner.study.summary import summarize_study
from tuner.study.verdict import decide

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = REPO / "test-artifacts"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_until_serving(url: str, proc: subprocess.Popen[bytes], limit_s: float = 60) -> None:
    """Block until the dashboard answers `url` (fail if the process exits or the limit passes)."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None:
            raise AssertionError(f"tuner dashboard exited with {proc.returncode} before serving")
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} did not answer within {limit_s} s")
        time.sleep(0.1)  # polling interval while the server starts, not synchronisation


@pytest.fixture
def page() -> Iterator[Page]:
    """A page in Debian's headless Chromium."""
    assert CHROMIUM.exists(), "Debian's chromium is required: apt-get install -y chromium (make test-deps)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser.new_page(viewport={"width": 1400, "height": 1000})
        browser.close()


@pytest.mark.slow
def test_dashboard_shows_feasibility_and_the_best_feasible_note(
    write_spec: SpecWriter, pg_url: str, tmp_path: Path, page: Page
) -> None:
    # fp32 routes pass a 1e-9 cosine tolerance, fp16 and int8 variants do not: infeasible trials are all but certain.
    spec = write_spec(
        **{
            "accuracy.tolerance": 1e-9,
            "run.budget": 6,
            "run.startup_trials": 6,
            "backend.name": "tests.backends:ChattyBackend",
            "backend.space": {"intra_op_threads": [0, 1], "execution_mode": ["sequential"]},
        }
    )
    run_study(spec, pg_url, confirm=True, confirm_top_k=1, confirm_rounds=6)
    url = normalize_url(pg_url)
    study = optuna.load_study(study_name="tiny", storage=url)
    summary = summarize_study(study)
    assert summary.best is not None and summary.infeasible >= 1, "the study needs feasible and infeasible trials"
    note = get_note(study)  # written by the workers and the confirmation, before any dashboard runs
    assert (
        f"Best feasible trial: #{summary.best.number}**" in note and study.user_attrs["confirmation"]["message"] in note
    )
    head = decide(summary, study.user_attrs["confirmation"], study.trials)
    assert note.index(head.sentence) < note.index("Best feasible trial"), "the verdict leads the note"

    port = _free_port()
    proc = start_tuner("dashboard", str(spec), "--storage", pg_url, "--port", str(port), log=tmp_path / "dashboard.log")
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(f"{base}/api/studies", proc)
        ARTIFACTS.mkdir(exist_ok=True)
        sid = oa.study_id(study)

        page.goto(f"{base}/dashboard/")
        expect(page.get_by_text("tiny", exact=False).first).to_be_visible()

        page.goto(f"{base}/dashboard/studies/{sid}")
        expect(
            page.get_by_text(f"Best Trial (number={summary.best.number})")
        ).to_be_visible()  # feasible, not the stock choice
        page.screenshot(path=str(ARTIFACTS / "dashboard-study.png"), full_page=True)

        page.goto(f"{base}/dashboard/studies/{sid}/trials")
        trials = study.trials
        expect(page.get_by_text(f"{len(trials)} Trials")).to_be_visible()
        listing = page.locator("ul").filter(has_text="Trial 0").first
        for state in ("Complete", "Pruned"):
            want = sum(1 for t in trials if t.state.name.capitalize() == state)
            expect(listing.get_by_text(state, exact=True)).to_have_count(want)

        infeasible = next(t for t in trials if not t.user_attrs["feasible"])
        page.goto(f"{base}/dashboard/studies/{sid}/trials?numbers={infeasible.number}")
        expect(page.get_by_text(f"Trial {infeasible.number} (trial_id=")).to_be_visible()
        expect(page.get_by_text("feasible False", exact=True)).to_be_visible()
        expect(page.get_by_text(f"failure_class {infeasible.user_attrs['failure_class']}", exact=True)).to_be_visible()
        expect(page.get_by_text('accuracy {"metric": "cosine"')).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "dashboard-infeasible-trial.png"), full_page=True)

        best = summary.best
        page.goto(f"{base}/dashboard/studies/{sid}/trials?numbers={best.number}")
        expect(page.get_by_text(f"Trial {best.number} (trial_id=")).to_be_visible()
        expect(page.get_by_text("feasible True", exact=True)).to_be_visible()
        expect(
            page.get_by_text(re.compile(r'^latency_ms \{"median"'))
        ).to_be_visible()  # not baseline_latency_ms (paired trials)

        page.goto(f"{base}/dashboard/studies/{sid}/note")
        body = page.locator("body")
        expect(body).to_contain_text(f"Best feasible trial: #{best.number}, latency")
        expect(body).to_contain_text(f"Verdict: {head.verdict}.")
        expect(body).to_contain_text(f"the default route (trial #{summary.baseline.number}")  # type: ignore[union-attr]
        expect(body).to_contain_text(f"Confirmation: {study.user_attrs['confirmation']['message']}")
        page.screenshot(path=str(ARTIFACTS / "dashboard-note.png"), full_page=True)

        # The worker uploads a trial's child log when the child printed something: every build here prints a line.
        logged = [t for t in trials if optuna.artifacts.get_all_artifact_meta(t, storage=oa.storage_of(study))]
        assert summary.baseline.number in {t.number for t in logged}, "the default route always builds, so it has a log"
        with urllib.request.urlopen(f"{base}/api/studies/{sid}?after=0") as resp:
            shown = {x["number"]: x for x in json.load(resp)["trials"]}
        for t in logged:
            assert [a["filename"] for a in shown[t.number]["artifacts"]] == ["child.log"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    shutil.copyfile(tmp_path / "dashboard.log", ARTIFACTS / "dashboard.log")


def test_feasible_best_storage_skips_a_faster_infeasible_trial(sqlite_url: str) -> None:
    storage = FeasibleBestStorage(sqlite_url)
    study = optuna.create_study(storage=storage, study_name="s")
    for value, accuracy in ((3.0, -1.0), (1.0, 2.0), (2.0, -0.5)):
        t = study.ask()
        t.set_constraint("accuracy", accuracy)
        study.tell(t, value)
    assert storage.get_best_trial(oa.study_id(study)).number == 2
    assert optuna.storages.RDBStorage(sqlite_url).get_best_trial(oa.study_id(study)).number == 1  # what stock shows


def test_binding_beyond_loopback_warns_and_a_bad_address_is_one_line(write_spec: SpecWriter, sqlite_url: str) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
    spec = (
        write_spec()
    )  # the storage holds another study, not this one: the dashboard serves it and says the study will appear
    optuna.create_study(storage=sqlite_url, study_name="another")
    # 192.0.2.1 (TEST-NET-1) is not on this machine: the bind fails, after the warning, without exposing anything.
    res = tuner("dashboard", str(spec), "--storage", sqlite_url, "--host", "192.0.2.1", "--port", str(_free_port()))
    assert res.returncode == 2
    assert "warning: optuna-dashboard has no authentication" in res.stderr
    assert "study tiny is not in sqlite:///" in res.stderr and "yet" in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("error: cannot serve on 192.0.2.1:")


def _get(url: str, host: str) -> tuple[int, bytes]:
    """GET `url` with the Host header `host` (what a browser sends for a rebound name); status and body."""
    request = urllib.request.Request(url, headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _rows(sqlite_url: str) -> dict[str, list[tuple]]:
    engine = create_engine(sqlite_url)
    with engine.connect() as conn:
        rows = {
            name: sorted(map(tuple, conn.execute(text(f'SELECT * FROM "{name}"')).all()), key=repr)
            for name in inspect(conn).get_table_names()
        }
    engine.dispose()
    return rows


def test_the_dashboard_refuses_a_foreign_host_header_and_writes_nothing(
    write_spec: SpecWriter, sqlite_url: str, tmp_path: Path
) -> None:
    study = optuna.create_study(storage=sqlite_url, study_name="tiny")
    study.tell(study.ask(), 1.0)
    before = _rows(sqlite_url)
    port = _free_port()
    proc = start_tuner(
        "dashboard",
        str(write_spec()),
        "--storage",
        sqlite_url,
        "--port",
        str(port),
        "--allow-host",
        "tuner.internal:8080",
        log=tmp_path / "dashboard.log",
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(f"{base}/api/studies", proc)
        for foreign in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.attacker.example", ""):
            code, body = _get(f"{base}/api/studies", foreign)
            assert code == 403 and b"tiny" not in body, (foreign, code, body[:200])
        for own in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}", "tuner.internal"):
            code, body = _get(f"{base}/api/studies", own)
            assert code == 200 and b'"tiny"' in body, (own, code)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert _rows(sqlite_url) == before  # no study note, nothing else: a read-only command


def test_a_process_writes_the_note_without_the_dashboard_app(sqlite_url: str) -> None:
    """The note is optuna-dashboard's own (read back with its `get_note`), written without importing its web app."""
    code = f"""
import sys, optuna
from tuner.study.note import update_note
study = optuna.create_study(study_name="n", storage={normalize_url(sqlite_url)!r})
assert update_note(study)
print(sorted(m for m in ("optuna_dashboard", "optuna.importance", "sklearn") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
    study = optuna.load_study(study_name="n", storage=normalize_url(sqlite_url))
    assert get_note(study).startswith("## Route Tuner: n")


def test_without_optuna_dashboard_the_note_is_skipped_with_one_warning_per_process() -> None:
    """A worker on a machine without optuna-dashboard goes on, saying once (not once per trial) why no note is
    written; `None` in `sys.modules` is how Python itself marks a module that cannot be imported."""
    code = """
import sys, optuna
sys.modules["optuna_dashboard"] = None
from tuner.study.note import update_note
study = optuna.create_study()
print([update_note(study) for _ in range(3)])
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[False, False, False]"
    assert out.stderr.count("optuna-dashboard is not installed here") == 1, out.stderr[-2000:]


@pytest.mark.parametrize("storage", ["sqlite", "postgresql"])
def test_the_note_written_in_one_transaction_is_what_optuna_dashboard_writes(
    storage: str, request: pytest.FixtureRequest
) -> None:
    """Version, chunks and the blanked chunks of a longer earlier note: attribute for attribute as `save_note`."""
    from optuna_dashboard import _note, save_note

    from tuner.study import optuna_adapter as oa

    url = normalize_url(request.getfixturevalue("sqlite_url" if storage == "sqlite" else "pg_url"))
    ours, theirs = (optuna.create_study(study_name=name, storage=url) for name in ("ours", "theirs"))
    for body in ("a" * 5000, "short note", "ü" * 2045):  # three chunks, then one (two left over), then exactly one
        oa.save_study_note(ours, body, _note)
        save_note(theirs, body)
        assert get_note(ours) == body
        assert system_attrs(ours) == system_attrs(theirs)
    assert system_attrs(ours)[_note.note_ver_key(None)] == 3


def system_attrs(study: optuna.Study) -> dict[str, object]:
    from tuner.study import optuna_adapter as oa

    return oa.storage_of(study).get_study_system_attrs(oa.study_id(study))
