"""Check that a model file is a readable ONNX model and list its graph inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
from google.protobuf.message import DecodeError

from tuner.errors import first_line

DTYPES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.BOOL: "bool",
}


def read_inputs(reader: Any, path: Path) -> dict[str, tuple[str, list[int | None] | None]]:
    """{input name: (numpy dtype name, dims with None for dynamic)} of the model at `path`; dims are
    None when the model leaves the rank open, [] for a scalar.

    `reader` is the spec reader whose `fail(field, expected)` builds the error.
    """
    if not path.is_file():
        raise reader.fail("model.path", f"file not found: {path}")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError, OSError) as exc:
        raise reader.fail("model.path", f"{path.name} is not a readable ONNX model ({type(exc).__name__})") from exc
    if not model.graph.node:
        raise reader.fail("model.path", f"{path.name} is not a readable ONNX model (no graph nodes)")
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        raise reader.fail(
            "model.path", f"{path.name} fails the ONNX checker: {first_line(exc, type(exc).__name__)}"
        ) from exc
    initializers = {i.name for i in model.graph.initializer}
    out: dict[str, tuple[str, list[int | None] | None]] = {}
    for inp in model.graph.input:
        if inp.name in initializers:
            continue
        t = inp.type.tensor_type
        dtype = DTYPES.get(t.elem_type)
        if dtype is None:
            raise reader.fail(f"model.inputs.{inp.name}", f"unsupported input element type {t.elem_type}")
        dims = (
            [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in t.shape.dim]
            if t.HasField("shape")
            else None
        )
        out[inp.name] = (dtype, dims)
    return out


def read_output_names(path: Path) -> list[str]:
    """The graph output names of the (already checked) model at `path`."""
    return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]
