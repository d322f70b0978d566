"""Precision variants: made once, content-addressed, and shaped for the compilers that take them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from tuner.precision import VariantOptions, make_variant

FEEDS = [{"x": np.random.default_rng(i).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)} for i in range(4)]


def _run(path: Path) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, FEEDS[0])[0]


@pytest.mark.parametrize(
    "options",
    [
        VariantOptions("fp16", "none"),
        VariantOptions("fp16", "sensitive"),
        VariantOptions("int8_static"),
        VariantOptions("int8_static", per_channel=False, calibration="percentile"),
        VariantOptions("int8_dynamic"),
        VariantOptions("fp8_static"),
    ],
    ids=str,
)
def test_variant_is_made_once_and_runs(options: VariantOptions, tiny_model: Path, tmp_path: Path) -> None:
    first = make_variant(tiny_model, options, FEEDS, tmp_path / "v")
    mtime = first.stat().st_mtime_ns
    assert make_variant(tiny_model, options, FEEDS, tmp_path / "v") == first and first.stat().st_mtime_ns == mtime
    assert first != tiny_model
    out, ref = _run(first), _run(tiny_model)
    assert out.shape == ref.shape and out.dtype == np.float32  # I/O types are kept


def test_fp32_is_the_model_itself_and_other_calibration_data_is_another_variant(
    tiny_model: Path, tmp_path: Path
) -> None:
    assert make_variant(tiny_model, VariantOptions("fp32"), FEEDS, tmp_path) == tiny_model
    a = make_variant(tiny_model, VariantOptions("int8_static"), FEEDS, tmp_path)
    b = make_variant(tiny_model, VariantOptions("int8_static"), FEEDS[:2], tmp_path)
    assert a != b


def test_tensorrt_qdq_is_symmetric_with_float_biases(tiny_model: Path, tmp_path: Path) -> None:
    path = make_variant(tiny_model, VariantOptions("int8_static", tensorrt_qdq=True), FEEDS, tmp_path)
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    zero_points = [
        inits[n.input[2]]
        for n in model.graph.node
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and len(n.input) > 2
    ]
    assert zero_points and all(not np.any(z) for z in zero_points)
    assert not [
        n
        for n in model.graph.node
        if n.op_type == "DequantizeLinear" and inits.get(n.input[0]) is not None and inits[n.input[0]].dtype == np.int32
    ]


def test_bf16_keeps_io_types_and_sorts_the_graph(tiny_model: Path, tmp_path: Path) -> None:
    model = onnx.load(str(make_variant(tiny_model, VariantOptions("bf16", "sensitive"), FEEDS, tmp_path)))
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert any(i.data_type == onnx.TensorProto.BFLOAT16 for i in model.graph.initializer)
    produced = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer}
    for node in model.graph.node:  # topologically sorted: every input exists before its consumer
        assert all(not x or x in produced for x in node.input), node.name
        produced.update(node.output)
