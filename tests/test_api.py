"""The Python API (`from tuner import Study`) on the real ONNX Runtime backend, and the README's example."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import optuna
import pytest

from tests.conftest import REPO
from tuner import Study
from tuner.errors import SpecError, TunerError
from tuner.events import PhaseEvent, TrialEvent
from tuner.store.urls import normalize_url

FP32 = {"precision": ["fp32"]}


def test_a_study_runs_and_reads_back_through_the_api(write_spec, sqlite_url, tmp_path) -> None:
    spec = write_spec(**{"run.budget": 2, "backend.space": FP32})
    study = Study.from_file(spec, storage=sqlite_url)
    events: list[object] = []
    verdict = study.run(confirm=False, callbacks=[events.append])
    assert verdict["verdict"] == "unconfirmed" and verdict["study"] == "tiny"
    assert verdict == study.best() | {"confirmation": None}
    trial_events = [e for e in events if isinstance(e, TrialEvent)]
    assert [e.number for e in trial_events] == [0, 1] and trial_events[-1].done == 2
    assert isinstance(events[0], PhaseEvent) and isinstance(events[-1], PhaseEvent)
    rows = study.trials()
    assert [r["number"] for r in rows] == [0, 1] and rows[0]["changes"] == {} and rows[0]["outcome"] == "feasible"
    stored = optuna.load_study(study_name="tiny", storage=normalize_url(sqlite_url)).trials
    measured = [t.user_attrs["measured_ms"] for t in stored]  # both timed uncontended here, each beside the default
    assert [r["latency_ms"] for r in rows] == [m["trial"] for m in measured]  # measured, not the objective's value
    assert [r["default_ms"] for r in rows] == [m["default"] for m in measured]  # the default's, timed beside it
    status = study.status()
    assert status["complete"] + status["pruned"] + status["failed"] == 2 and status["verdict"] == verdict["verdict"]
    best = measured[status["best_trial"]]
    assert (status["best_ms"], status["best_default_ms"]) == (best["trial"], best["default"])  # one timing's pair
    message = study.export(tmp_path / "out", trial=verdict["trial"])
    assert "exported" in message and (tmp_path / "out" / "route.json").exists()
    exported = measured[verdict["trial"]]
    assert (
        f"in the study: {exported['trial']:.4g} ms, the default route {exported['default']:.4g} ms beside it"
        in (tmp_path / "out" / "README.md").read_text()
    )


def test_a_study_from_a_mapping_runs_like_its_file(write_spec, sqlite_url, tmp_path) -> None:
    doc = tomllib.loads(write_spec(**{"run.budget": 1, "backend.space": FP32}).read_text())
    doc["model"]["path"] = "tiny.onnx"  # relative to base_dir
    study = Study.from_dict(doc, tmp_path, storage=sqlite_url)
    assert study.run(confirm=False)["trial"] == 0
    assert Study.from_file(tmp_path / ".tuner" / "tiny" / "study.toml", storage=sqlite_url).status()["complete"] == 1


def test_errors_are_exceptions_with_the_one_line_messages(write_spec, tmp_path) -> None:
    with pytest.raises(SpecError, match=r"accuracy\.tolerance: expected a number >= 0"):
        Study.from_file(write_spec(**{"accuracy.tolerance": -1.0}))
    with pytest.raises(SpecError, match=r"<mapping>: \[model\]: missing section"):
        Study.from_dict({"study": {"name": "x"}}, tmp_path)
    with pytest.raises(TunerError, match="does not exist") as info:
        Study.from_file(write_spec(), storage=f"sqlite:///{tmp_path / 'none.db'}").status()
    assert info.value.exit_code == 2 and not (tmp_path / "none.db").exists()


def test_the_readme_example_runs(write_spec, tmp_path) -> None:
    """The README's Python example, as printed, on a tiny study in place of the bundled one."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), flags=re.DOTALL)
    example = next(b for b in blocks if "from tuner import Study" in b)
    bundled = re.search(r'Study\.from_file\("([^"]+)"', example)
    assert bundled and (REPO / bundled.group(1)).exists(), "the example names the bundled study file"
    spec = write_spec(**{"run.budget": 2, "backend.space": FP32})
    code = example.replace(bundled.group(1), str(spec))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("unconfirmed\n0 feasible "), done.stdout


def test_the_docstring_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import doctest

    import tuner.api

    monkeypatch.chdir(REPO)  # the examples name the bundled files from the checkout's root
    result = doctest.testmod(tuner.api)
    assert result.attempted >= 3 and result.failed == 0
