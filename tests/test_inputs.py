"""Any model's inputs: scalar inputs, a batch axis other than the first, per-input constants and ranges,
from the study file and from a data file; each mistake is one line naming the field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import BRIEF_TIMING, run_study
from tests.helpers import trials
from tests.models import vad_model
from tuner import job as J
from tuner.errors import SpecError
from tuner.measure.inputs import load_feeds
from tuner.measure.reference import compute_reference
from tuner.spec import load_spec
from tuner.spec.toml import dumps

MODEL = """[model]
path = "vad.onnx"
inputs.input.shape = [1, 512]
inputs.state.shape = [2, 1, 128]
inputs.state.batch_axis = 1
inputs.sr.shape = []
"""

CONSTANTS = """[data.inputs.sr]
value = 16000
[data.inputs.state]
value = 0.0
[data.inputs.input]
low = -0.5
high = 0.5
"""

REST = f"""[accuracy]
metric = "cosine"
tolerance = 0.001

{dumps({"objective": BRIEF_TIMING})}
[backend]
name = "onnxruntime"
space.precision = ["fp32", "int8_static"]  # its fp16 routes: tests/test_ort_loads.py

[run]
budget = 3
heartbeat_s = 0.5
racing = false
"""


def _study(tmp_path: Path, data: str, model: str = MODEL, name: str = "vad") -> Path:
    vad_model(tmp_path / "vad.onnx")
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[study]\nname = "{name}"\n\n{model}\n[data]\nsamples = 4\ngate_samples = 2\n{data}\n{REST}')
    return path


def _data_file(tmp_path: Path, sr: np.ndarray) -> Path:
    rng = np.random.default_rng(1)
    path = tmp_path / "vad.npz"
    np.savez(
        path,
        input=rng.uniform(-0.5, 0.5, (4, 512)).astype(np.float32),
        state=np.zeros((2, 4, 128), np.float32) + np.arange(4, dtype=np.float32)[None, :, None],
        sr=sr,
    )
    return path


def test_the_issue_example_gives_constant_scalars_states_and_ranged_inputs(tmp_path: Path) -> None:
    spec = load_spec(_study(tmp_path, CONSTANTS))
    assert spec.model.inputs == {"input": (1, 512), "state": (2, 1, 128), "sr": ()}
    assert (
        spec.model.batch_axis("state") == 1
        and spec.model.batch_axis("input") == 0
        and spec.model.batch_axis("sr") is None
    )
    feeds = load_feeds(spec)
    assert len(feeds) == 4
    for feed in feeds:
        assert feed["sr"].shape == () and feed["sr"].dtype == np.int64 and int(feed["sr"]) == 16000
        assert feed["state"].shape == (2, 1, 128) and not feed["state"].any()
        assert feed["input"].shape == (1, 512) and -0.5 <= feed["input"].min() and feed["input"].max() < 0.5
    assert not np.array_equal(feeds[0]["input"], feeds[1]["input"])
    # sr = 16000 takes the model's own branch (the other negates the projection)
    ref = compute_reference(spec.model.path, feeds[:1])[0]
    other = compute_reference(spec.model.path, [{**feeds[0], "sr": np.array(8000, np.int64)}])[0]
    assert not np.allclose(ref["output"], other["output"])


def test_integer_inputs_get_integer_ranges(tmp_path: Path) -> None:
    spec = load_spec(_study(tmp_path, "[data.inputs.sr]\nlow = 8000\nhigh = 8002\n"))
    values = {int(f["sr"]) for f in load_feeds(spec)}
    assert values <= {8000, 8001} and spec.data.inputs["sr"].low == 8000


@pytest.mark.parametrize("sr", [np.array(16000, np.int64), np.full(4, 16000, np.int64)], ids=["0-D", "1-D"])
def test_a_data_file_holds_scalars_and_states_batched_on_axis_1(tmp_path: Path, sr: np.ndarray) -> None:
    _data_file(tmp_path, sr)
    feeds = load_feeds(load_spec(_study(tmp_path, 'file = "vad.npz"\n')))
    for i, feed in enumerate(feeds):
        assert feed["sr"].shape == () and int(feed["sr"]) == 16000
        assert feed["state"].shape == (2, 1, 128) and np.all(feed["state"] == i)  # sample i along axis 1
        assert feed["input"].shape == (1, 512)


def test_a_study_file_constant_overrides_an_input_missing_from_the_data_file(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    np.savez(
        tmp_path / "vad.npz",
        input=rng.uniform(-0.5, 0.5, (4, 512)).astype(np.float32),
        state=np.zeros((2, 4, 128), np.float32),
    )
    feeds = load_feeds(load_spec(_study(tmp_path, 'file = "vad.npz"\n[data.inputs.sr]\nvalue = 16000\n')))
    assert [int(f["sr"]) for f in feeds] == [16000] * 4


@pytest.mark.parametrize("source", ["study-file", "data-file"])
def test_a_scalar_and_axis_1_state_model_runs_end_to_end(source: str, tmp_path: Path, sqlite_url: str) -> None:
    if source == "data-file":
        _data_file(tmp_path, np.array(16000, np.int64))
        study = _study(tmp_path, 'file = "vad.npz"\n')
    else:
        study = _study(tmp_path, CONSTANTS)
    run_study(study, sqlite_url)
    done = trials(sqlite_url, "vad")
    assert len(done) == 3 and all(t.state.name != "FAIL" for t in done), [t.user_attrs for t in done]
    # every trial built, ran and was judged (timed, infeasible or pruned as slow): none failed
    assert all(J.OUTCOMES[t.user_attrs.get("failure_class") or J.OK].tally != "failed" for t in done), [
        (t.params.get("precision"), t.user_attrs.get("failure_class"), t.user_attrs.get("message")) for t in done
    ]
    baseline = next(t for t in done if t.user_attrs.get("source") == "baseline")
    assert baseline.user_attrs["accuracy"]["value"] < 1e-6


BAD = {
    "scalar shape for a vector": (
        "inputs.input.shape = [1, 512]",
        "inputs.input.shape = []",
        "",
        "model.inputs.input.shape",
        "does not match",
    ),
    "batch axis out of range": (
        "inputs.state.batch_axis = 1",
        "inputs.state.batch_axis = 3",
        "",
        "model.inputs.state.batch_axis",
        "0 to 2",
    ),
    "batch axis of a scalar": (
        "inputs.sr.shape = []",
        "inputs.sr = { shape = [], batch_axis = 0 }",
        "",
        "model.inputs.sr.batch_axis",
        "no batch axis",
    ),
    "unknown input key": (
        "inputs.sr.shape = []",
        "inputs.sr = { shape = [], axis = 0 }",
        "",
        "model.inputs.sr",
        "batch_axis",
    ),
    "float value for an int input": (
        None,
        None,
        "[data.inputs.sr]\nvalue = 16000.5\n",
        "data.inputs.sr.value",
        "integer",
    ),
    "bool value for a float input": (
        None,
        None,
        "[data.inputs.state]\nvalue = true\n",
        "data.inputs.state.value",
        "number",
    ),
    "value and range": (
        None,
        None,
        "[data.inputs.input]\nvalue = 0.0\nlow = 1.0\n",
        "data.inputs.input.value",
        "not both",
    ),
    "empty range": (None, None, "[data.inputs.input]\nlow = 0.5\nhigh = 0.5\n", "data.inputs.input.high", "above low"),
    "float range for an int input": (
        None,
        None,
        "[data.inputs.sr]\nlow = 0.5\nhigh = 2\n",
        "data.inputs.sr.low",
        "integer",
    ),
    "unknown input": (None, None, "[data.inputs.audio]\nvalue = 1.0\n", "data.inputs.audio", "no such input"),
    "unknown field": (None, None, "[data.inputs.sr]\nconstant = 1\n", "data.inputs.sr", "value"),
    "range with a data file": (
        None,
        None,
        'file = "vad.npz"\n[data.inputs.input]\nlow = 0.0\n',
        "data.inputs.input.low",
        "generated",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_inputs_fail_in_one_line_naming_the_field(case: str, tmp_path: Path) -> None:
    old, new, data, field, needle = BAD[case]
    _data_file(tmp_path, np.array(16000, np.int64))
    model = MODEL.replace(old, new) if old else MODEL
    with pytest.raises(SpecError) as err:
        load_spec(_study(tmp_path, data, model))
    message = str(err.value)
    assert len(message.splitlines()) == 1 and f": {field}: " in message and needle in message, message


@pytest.mark.parametrize(
    "arrays,needle",
    [
        ({"sr": np.full((4, 1), 16000, np.int64)}, "a 1-D array (one value per sample) or a 0-D array"),
        ({"sr": np.full(2, 16000, np.int64)}, "one per sample"),
        ({"state": np.zeros((4, 2, 128), np.float32)}, "expected [2, N, 128] (samples along axis 1)"),
        ({"state": np.zeros((2, 3, 128), np.float32)}, "needs 4"),
        ({"sr": np.array(16000, np.int32)}, "the model's input is int64"),
    ],
    ids=["2-D scalar", "too few scalars", "batch on the wrong axis", "too few states", "wrong dtype"],
)
def test_bad_data_files_name_the_array_in_one_line(cli, arrays: dict, needle: str, tmp_path: Path) -> None:
    base = {
        "input": np.zeros((4, 512), np.float32),
        "state": np.zeros((2, 4, 128), np.float32),
        "sr": np.array(16000, np.int64),
    }
    np.savez(tmp_path / "vad.npz", **{**base, **arrays})
    study = _study(tmp_path, 'file = "vad.npz"\n')
    result = cli("run", str(study), "--storage", f"sqlite:///{tmp_path / 'db.sqlite'}")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "data.file" in result.stderr and needle in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "db.sqlite").exists()


def test_scalars_stay_scalars_in_hashes_and_backend_feeds() -> None:
    """A 0-D feed is not a 1-element vector: hashed apart, handed to Inductor and replay as 0-D."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'route-tuner[inductor]')")

    from tuner.backends.inductor.engine import Engine
    from tuner.backends.replay.landscape import decode_array, encode_array, feed_key
    from tuner.measure.inputs import feeds_hash

    scalar, vector = {"sr": np.array(16000, np.int64)}, {"sr": np.array([16000], np.int64)}
    assert feeds_hash([scalar]) != feeds_hash([vector]) and feed_key(scalar) != feed_key(vector)
    assert decode_array(encode_array(scalar["sr"])).shape == ()
    engine = Engine(lambda *a: a, torch.device("cpu"), torch.float16, False, False, ["sr", "state"], [], {})
    sr, state = engine.inputs({"sr": scalar["sr"], "state": np.zeros((2, 1, 128), np.float32)})
    assert sr.shape == () and sr.dtype == torch.int64 and int(sr) == 16000
    assert state.shape == (2, 1, 128) and state.dtype == torch.float16
