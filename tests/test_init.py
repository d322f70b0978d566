"""`tuner init MODEL.onnx` writes a commented study file that runs as written."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import REPO, run_study
from tests.models import conv_model

BUNDLED = REPO / "models" / "efficientnet_lite0.onnx"


def mixed_inputs_model(path: Path) -> Path:
    """Three inputs: `x` float [batch, 4] (dynamic batch), `ids` int64 [batch, 3] (rows of a 2-row table) and
    `k`, an int64 scalar; `y` = x * k + the sum of the rows `ids` picks, float [batch, 4]."""
    table = numpy_helper.from_array(np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32), "table")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"]),
        helper.make_node("ReduceSum", ["rows", "axes"], ["picked"], keepdims=0),
        helper.make_node("Cast", ["k"], ["kf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "kf"], ["scaled"]),
        helper.make_node("Add", ["scaled", "picked"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mixed_inputs",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 3]),
            helper.make_tensor_value_info("k", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [table, axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _init_and_run(cli, model: Path, out: Path, *init_args: str) -> dict:
    made = cli("init", str(model), "-o", str(out), *init_args)
    assert made.returncode == 0, made.stderr
    assert "review this" in made.stderr and out.exists()
    storage = f"sqlite:///{out.parent / 'study.db'}"
    run_study(out, storage, 2)
    return tomllib.loads(out.read_text())


def test_init_on_the_bundled_model_runs_as_written(cli, tmp_path: Path) -> None:
    doc = _init_and_run(cli, BUNDLED, tmp_path / "x.toml")
    assert doc["model"]["inputs"]["images"]["shape"] == [1, 3, 224, 224]
    assert doc["accuracy"] == {"metric": "top1_mismatch", "tolerance": 0.125}  # one logits output, 8 samples
    assert "file" not in doc["data"] and doc["data"]["seed"] == 0
    assert "storage" in (tmp_path / "x.toml").read_text()  # the storage line, commented out


def test_init_on_a_model_with_integer_scalar_and_dynamic_inputs_runs_as_written(cli, tmp_path: Path) -> None:
    model = mixed_inputs_model(tmp_path / "mixed.onnx")
    doc = _init_and_run(cli, model, tmp_path / "mixed.toml")
    text = (tmp_path / "mixed.toml").read_text()
    shapes = {name: entry["shape"] for name, entry in doc["model"]["inputs"].items()}
    assert shapes == {"x": [1, 4], "ids": [1, 3], "k": []}
    assert "dynamic dimension(s) 0 set to 1" in text
    assert doc["data"]["inputs"] == {"ids": {"low": 0, "high": 2}, "k": {"low": 0, "high": 2}}
    assert doc["accuracy"]["metric"] == "top1_mismatch"  # one 2-D output


def test_init_with_a_data_file_takes_its_sample_count(cli, tmp_path: Path) -> None:
    model = conv_model(tmp_path / "cnn.onnx")
    np.savez(tmp_path / "val.npz", x=np.zeros((4, 3, 16, 16), np.float32))
    out = tmp_path / "studies" / "cnn.toml"
    out.parent.mkdir()
    made = cli("init", str(model), "--data", str(tmp_path / "val.npz"), "-o", str(out))
    assert made.returncode == 0, made.stderr
    doc = tomllib.loads(out.read_text())
    assert doc["data"] == {"file": "../val.npz", "samples": 4, "gate_samples": 2}
    assert doc["model"]["path"] == "../cnn.onnx" and doc["accuracy"]["tolerance"] == 0.25


def test_init_times_an_image_model_of_any_size_at_224(cli, tmp_path: Path) -> None:
    model = conv_model(tmp_path / "cnn.onnx", size="side", batch="N")
    made = cli("init", str(model), "-o", str(tmp_path / "cnn.toml"))
    assert made.returncode == 0, made.stderr
    text = (tmp_path / "cnn.toml").read_text()
    assert tomllib.loads(text)["model"]["inputs"]["x"]["shape"] == [1, 3, 224, 224]
    assert "dynamic dimension(s) 0 set to 1; 2, 3 set to 224 (an image's height and width) (review this)" in text


def test_init_with_a_data_file_takes_the_dynamic_dimensions_of_its_arrays(cli, tmp_path: Path) -> None:
    model = conv_model(tmp_path / "cnn.onnx", size="side", batch="N")
    np.savez(tmp_path / "val.npz", x=np.zeros((5, 3, 40, 40), np.float32))
    made = cli("init", str(model), "--data", str(tmp_path / "val.npz"), "-o", str(tmp_path / "cnn.toml"))
    assert made.returncode == 0, made.stderr  # the file it wrote loads: its shape fits the data
    text = (tmp_path / "cnn.toml").read_text()
    doc = tomllib.loads(text)
    assert doc["model"]["inputs"]["x"]["shape"] == [1, 3, 40, 40] and doc["data"]["samples"] == 5
    assert "dynamic dimension(s) 0 set to 1; 2, 3 from val.npz" in text


def test_init_refuses_to_overwrite_a_file(cli, tmp_path: Path) -> None:
    out = tmp_path / "mine.toml"
    out.write_text("# my study\n")
    refused = cli("init", str(BUNDLED), "-o", str(out))
    assert refused.returncode == 2 and "not overwriting" in refused.stderr
    assert out.read_text() == "# my study\n"


def test_init_says_what_a_pre_quantized_model_already_is(cli, tmp_path: Path) -> None:
    from onnxruntime.quantization import quantize_dynamic

    quantize_dynamic(str(conv_model(tmp_path / "cnn.onnx")), str(tmp_path / "q.onnx"))
    made = cli("init", str(tmp_path / "q.onnx"), "-o", str(tmp_path / "q.toml"))
    assert made.returncode == 0, made.stderr
    text = (tmp_path / "q.toml").read_text()
    assert "the model is already quantized" in text and "precision fp32 builds the graph as given" in text
    assert "space" not in tomllib.loads(text)["backend"]  # nothing to restrict: the backend offers no variant
