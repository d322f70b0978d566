"""Small real ONNX models built in the tests (real weights from a seeded generator)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def conv_model(path: Path, size: int | str = 16, seed: int = 0, batch: int | str = 1) -> Path:
    """A small CNN: Conv-Relu-Conv-Relu-GlobalAveragePool-Flatten-Gemm, input `x` [batch,3,size,size] -> `y`
    [batch,10] (a `batch` or `size` named by a string is a dynamic dimension)."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.normal(0, 0.2, (16, 8, 3, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.normal(0, 0.1, (16,)).astype(np.float32), "b2"),
        numpy_helper.from_array(rng.normal(0, 0.3, (10, 16)).astype(np.float32), "w3"),
        numpy_helper.from_array(rng.normal(0, 0.1, (10,)).astype(np.float32), "b3"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def vad_model(path: Path, seed: int = 0) -> Path:
    """A stateful audio-style model shaped like Silero VAD's interface.

    Inputs: `input` float32 [B, 512], `state` float32 [2, B, 128] (batch on axis 1), `sr` int64 scalar.
    Outputs: `output` [B, 1] and `stateN` [2, B, 128]. `sr` selects a branch (an If node): 16000
    takes the model's own path; any other rate negates the projection, so a study fed the wrong `sr`
    tunes a branch the model never takes in use.
    """
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.05, (512, 128)).astype(np.float32), "w_in"),
        numpy_helper.from_array(rng.normal(0, 0.1, (128, 1)).astype(np.float32), "w_out"),
        numpy_helper.from_array(np.array(16000, np.int64), "rate"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    h = helper.make_tensor_value_info("h", TensorProto.FLOAT, ["B", 128])
    then = helper.make_graph([helper.make_node("Identity", ["proj"], ["h"])], "then", [], [h])
    other = helper.make_graph(
        [helper.make_node("Neg", ["proj"], ["h_else"])],
        "else",
        [],
        [helper.make_tensor_value_info("h_else", TensorProto.FLOAT, ["B", 128])],
    )
    nodes = [
        helper.make_node("MatMul", ["input", "w_in"], ["proj"]),
        helper.make_node("Equal", ["sr", "rate"], ["is16k"]),
        helper.make_node("If", ["is16k"], ["hb"], then_branch=then, else_branch=other),
        helper.make_node("Unsqueeze", ["hb", "axis0"], ["hu"]),
        helper.make_node("Mul", ["state", "half"], ["decay"]),
        helper.make_node("Add", ["decay", "hu"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["stateN"]),
        helper.make_node("ReduceMean", ["stateN"], ["mean"], axes=[0], keepdims=0),
        helper.make_node("MatMul", ["mean", "w_out"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes,
        "vad",
        [
            helper.make_tensor_value_info("input", TensorProto.FLOAT, ["B", 512]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "B", 128]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info("output", TensorProto.FLOAT, ["B", 1]),
            helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, "B", 128]),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def endless_loop_model(path: Path) -> Path:
    """A valid model that ONNX Runtime runs for ever: a Loop of 10^15 iterations adding 1 to `x` [1,10]."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1, 10]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1, 10]),
        ],
        [numpy_helper.from_array(np.ones((1, 10), np.float32), "one")],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "cond", "x"], ["y"], body=body)],
        "endless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(np.array(10**15, np.int64), "trips"), numpy_helper.from_array(np.array(True), "cond")],
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def unknown_op_model(path: Path) -> Path:
    """A model the ONNX checker accepts but ONNX Runtime cannot load: one op of an unregistered domain."""
    graph = helper.make_graph(
        [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example.unknown")],
        "unknown_op",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
    )
    return _save(
        helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example.unknown", 1)]
        ),
        path,
    )


def _save(model: onnx.ModelProto, path: Path) -> Path:
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


MLP_SHAPE = (2, 16)  # the MLP's input x (`mlp_onnx`)


def mlp_weights() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The MLP's weights (`mlp_onnx`), from a seeded generator: w1 [18,32], b1 [32], w2 [32,4]."""
    rng = np.random.default_rng(0)
    return (
        rng.normal(0, 0.3, (18, 32)).astype(np.float32),
        rng.normal(0, 0.1, (32,)).astype(np.float32),
        rng.normal(0, 0.3, (32, 4)).astype(np.float32),
    )


def mlp_onnx(path: Path, batch: int | str = MLP_SHAPE[0]) -> Path:
    """x [2,16] -> Pad(1, 1) -> MatMul -> Add -> Relu -> MatMul -> Reshape(constant [-1, 4]) -> y [2,4].

    Pad and Reshape take their pads and shape as tensors, as exported CNNs do (EfficientNet's same
    padding, the flatten before the classifier); onnx2torch's modules for them break or fail Dynamo
    tracing until the backend makes them static. `batch` names dimension 0 (e.g. "batch": dynamic).
    """
    w1, b1, w2 = mlp_weights()
    graph = helper.make_graph(
        [
            helper.make_node("Pad", ["x", "pads"], ["p"]),
            helper.make_node("MatMul", ["p", "w1"], ["h"]),
            helper.make_node("Add", ["h", "b1"], ["a"]),
            helper.make_node("Relu", ["a"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["m"]),
            helper.make_node("Reshape", ["m", "shape"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, MLP_SHAPE[1]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])],
        [
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(b1, "b1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(np.array([-1, 4], dtype=np.int64), "shape"),
            numpy_helper.from_array(np.array([0, 1, 0, 1], dtype=np.int64), "pads"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path
