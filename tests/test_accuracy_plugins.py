"""A study's own accuracy metric (`package.module:function`) and per-output metrics and tolerances."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import BRIEF_TIMING, SpecWriter, run_study, tuner
from tests.helpers import trials
from tests.models import vad_model
from tuner import job as J
from tuner.errors import SpecError
from tuner.measure.accuracy import Tolerances
from tuner.measure.judge import Judge, Rule
from tuner.measure.user_metric import MetricError
from tuner.spec import load_spec
from tuner.spec.toml import dumps

PLUGIN = "tests.accuracy_metrics:recall_at_k_loss"


def _outcomes(url: str, study: str) -> list[tuple[str, str]]:
    return [(t.user_attrs.get("failure_class") or J.OK, t.user_attrs.get("message", "")) for t in trials(url, study)]


def _none_failed(url: str, study: str) -> bool:
    return all(J.OUTCOMES[status].tally != "failed" for status, _ in _outcomes(url, study))


def test_a_study_whose_metric_is_a_python_function_runs_end_to_end(write_spec: SpecWriter, sqlite_url: str) -> None:
    spec = write_spec(**{"accuracy.metric": PLUGIN, "accuracy.tolerance": 0.34, "run.budget": 2})
    run_study(spec, sqlite_url)
    done = trials(sqlite_url, "tiny")
    assert len(done) == 2 and _none_failed(sqlite_url, "tiny"), _outcomes(sqlite_url, "tiny")
    baseline = next(t for t in done if t.user_attrs.get("source") == "baseline")
    assert baseline.user_attrs["accuracy"]["value"] == 0.0
    assert set(baseline.user_attrs["accuracy_per_output"]) == {PLUGIN}


def test_a_metric_that_raises_fails_the_route_naming_the_metric(write_spec: SpecWriter, sqlite_url: str) -> None:
    spec = write_spec(**{"accuracy.metric": "tests.accuracy_metrics:broken", "run.budget": 1})
    run_study(spec, sqlite_url)
    outcomes = _outcomes(sqlite_url, "tiny")
    assert outcomes, "no trial ran"
    status, message = outcomes[0]
    assert status == J.RUNTIME_ERROR
    assert message == "accuracy.metric 'tests.accuracy_metrics:broken' raised KeyError: 'boxes'"


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ("tests.no_such_module:fn", "cannot import 'tests.no_such_module:fn' (ModuleNotFoundError: No module named"),
        ("tests.accuracy_metrics:nope", "cannot import 'tests.accuracy_metrics:nope' (AttributeError: module"),
        ("tests.accuracy_metrics:NOT_A_FUNCTION", "'tests.accuracy_metrics:NOT_A_FUNCTION' is not callable"),
    ],
)
def test_a_bad_metric_is_one_line_naming_it(write_spec: SpecWriter, metric: str, expected: str) -> None:
    with pytest.raises(SpecError) as err:
        load_spec(write_spec(**{"accuracy.metric": metric}))
    assert err.value.field == "accuracy.metric" and err.value.expected.startswith(expected)


def test_a_bad_metric_exits_2_with_one_line(write_spec: SpecWriter, sqlite_url: str) -> None:
    result = tuner("run", str(write_spec(**{"accuracy.metric": "tests.no_such_module:fn"})), "--storage", sqlite_url)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "accuracy.metric: cannot import 'tests.no_such_module:fn'" in lines[0], result.stderr


def test_editing_the_metric_changes_the_cache_key(tmp_path: Path, write_spec: SpecWriter, monkeypatch) -> None:
    module = tmp_path / "own_metric.py"
    module.write_text("def loss(reference, candidate):\n    return 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = write_spec(**{"accuracy.metric": "own_metric:loss"})
    before = load_spec(spec).accuracy.settings()
    module.write_text("def loss(reference, candidate):\n    return 1.0\n")
    after = load_spec(spec).accuracy.settings()
    assert before["metric"] == after["metric"] == "own_metric:loss"
    assert before["metric_sha256"] != after["metric_sha256"]
    assert "metric_sha256" not in load_spec(write_spec()).accuracy.settings()


VAD = """[study]
name = "vad"
[model]
path = "vad.onnx"
inputs.input.shape = [1, 512]
inputs.state.shape = [2, 1, 128]
inputs.state.batch_axis = 1
inputs.sr.shape = []
[data]
samples = 4
gate_samples = 2
[data.inputs.sr]
value = 16000
[accuracy]
metric = "cosine"
tolerance = 0.01
[accuracy.outputs.stateN]
{rule}
{objective}[backend]
name = "onnxruntime"
space.precision = ["fp32"]
[run]
budget = 2
heartbeat_s = 0.5
trial_timeout_s = 120.0
"""


def _vad_study(tmp_path: Path, rule: str) -> Path:
    vad_model(tmp_path / "vad.onnx")
    path = tmp_path / "vad.toml"
    path.write_text(VAD.format(rule=rule, objective=dumps({"objective": BRIEF_TIMING})))
    return path


def test_a_study_with_a_per_output_tolerance_runs_end_to_end(tmp_path: Path, sqlite_url: str) -> None:
    study = _vad_study(tmp_path, 'metric = "max_abs"\ntolerance = 0.05')
    assert load_spec(study).accuracy.outputs == {"stateN": Rule("max_abs", 0.05, Tolerances())}
    run_study(study, sqlite_url)
    done = trials(sqlite_url, "vad")
    assert done and _none_failed(sqlite_url, "vad"), _outcomes(sqlite_url, "vad")
    assert set(done[0].user_attrs["accuracy_per_output"]) == {"output", "stateN"}


def test_an_unknown_output_is_one_line_listing_the_models_outputs(tmp_path: Path) -> None:
    study = _vad_study(tmp_path, 'metric = "max_abs"\ntolerance = 0.05')
    study.write_text(study.read_text().replace("[accuracy.outputs.stateN]", "[accuracy.outputs.state_n]"))
    with pytest.raises(SpecError) as err:
        load_spec(study)
    assert err.value.field == "accuracy.outputs.state_n"
    assert err.value.expected == "the model has no such output; its outputs are output, stateN"


def _feeds(values: list[float]) -> list[dict[str, np.ndarray]]:
    return [{"a": np.array([[v, 0.0]]), "b": np.array([[v, 1.0]])} for v in values]


def test_the_worst_output_relative_to_its_own_tolerance_decides_and_is_named() -> None:
    judge = Judge("max_abs", 0.1, outputs={"b": Rule("max_abs", 1.0)})
    reference, candidate = _feeds([0.0, 0.0, 0.0]), _feeds([0.05, 0.5, 0.2])
    values = judge.values(candidate, reference)
    assert values == pytest.approx({"a": 0.5, "b": 0.5})
    assert judge.worst(values) == pytest.approx(0.5)  # a: 0.5 against 0.1; b: 0.5 against 1.0 counts as 0.05
    assert judge.breach(values, candidate, reference) == "output a: max_abs=0.5 > 0.1 (worst at feed 1)"
    within = Judge("max_abs", 0.6, outputs={"b": Rule("max_abs", 0.4)})
    assert within.worst(values) == pytest.approx(0.75)
    assert within.breach(values, candidate, reference) == "output b: max_abs=0.5 > 0.4 (worst at feed 1)"
    assert Judge("max_abs", 0.6, outputs={"b": Rule("max_abs", 0.6)}).breach(values, candidate, reference) is None


def test_a_study_function_sees_every_feeds_outputs_and_its_failures_name_it() -> None:
    seen: list[tuple[int, list[str]]] = []

    def loss(reference: list[dict[str, np.ndarray]], candidate: list[dict[str, np.ndarray]]) -> float:
        seen.append((len(candidate), sorted(candidate[0])))
        return float(np.mean([np.abs(c["a"] - r["a"]).max() for r, c in zip(reference, candidate)]))

    judge = Judge("mine:loss", 0.1, _fn=loss)
    reference, candidate = _feeds([0.0, 0.0]), _feeds([0.1, 0.5])
    values = judge.values(candidate, reference)
    assert values == pytest.approx({"mine:loss": 0.3}) and seen == [(2, ["a", "b"])]
    assert judge.breach(values, candidate, reference) == "mine:loss=0.3 > 0.1"
    assert judge.values(_feeds([np.nan, 0.0]), reference) == {"mine:loss": float("inf")} and len(seen) == 1
    with pytest.raises(MetricError, match=r"^accuracy.metric 'mine:loss' returned -1.0, expected a number >= 0$"):
        Judge("mine:loss", 0.1, _fn=lambda r, c: -1.0).values(candidate, reference)


def test_the_documented_example_metric_runs_as_shown(tmp_path: Path, write_spec: SpecWriter, monkeypatch) -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "accuracy.md").read_text()
    code = next(block for block in re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL) if "ocr_metrics" in block)
    (tmp_path / "ocr_metrics.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_spec(write_spec(**{"accuracy.metric": "ocr_metrics:cer"})).accuracy.metric_sha256
    from ocr_metrics import cer  # type: ignore[import-not-found]

    def logits(labels: list[int]) -> np.ndarray:  # one sample [time, classes] whose best class per step is `labels`
        return np.eye(4)[labels][None]

    truth = [{"logits": logits([1, 1, 0, 2, 3, 0, 3])}]  # decodes to 1 2 3 3
    assert cer(truth, truth) == 0.0
    assert cer(truth, [{"logits": logits([1, 0, 2, 2, 2, 0, 3])}]) == 0.25  # 1 2 3: one deletion in 4
