"""Every precision variant of the bundled EfficientNet-Lite0 and of the transformer encoders is a valid,
topologically sorted ONNX graph with positive Q/DQ scales: what TensorRT's strict ONNX parser needs.

The checks are the ONNX checker and an independent order check written here (not `graph.problems`),
so a repair that breaks the graph cannot pass by agreeing with itself. `repair` is also shown to fix
the faults that converters were seen to leave: duplicate Cast nodes, unsorted nodes, zero-scale Q/DQ.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.models import vad_model
from tuner.precision import BLOCK_LISTS, VariantOptions, make_variant
from tuner.precision.graph import problems, repair

REPO = Path(__file__).resolve().parents[1]

VARIANTS = [VariantOptions(p, k) for p in ("fp16", "bf16") for k in BLOCK_LISTS] + [
    VariantOptions("int8_dynamic"),
    VariantOptions("int8_static"),
    VariantOptions("int8_static", tensorrt_qdq=True),
    VariantOptions("fp8_static", tensorrt_qdq=True),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[dict[str, np.ndarray]]]]:
    """EfficientNet-Lite0, the Inductor study's encoder, the TensorRT bench's encoder and the VAD-shaped
    model (an If whose branches read an outer value: fp16 casts it in both), with 2 feeds each."""
    from bench.gpu import encoder
    from bench.gpu.trt_rtx_builds import transformer_onnx

    tmp = tmp_path_factory.mktemp("models")
    rng = np.random.default_rng(0)
    enc = encoder.export(tmp / "encoder.onnx")
    enc2, shapes = transformer_onnx(tmp / "encoder2.onnx")
    return {
        "efficientnet": (
            REPO / "models" / "efficientnet_lite0.onnx",
            [{"images": rng.uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32)} for _ in range(2)],
        ),
        "encoder": (
            enc,
            [{"input_ids": rng.integers(0, encoder.VOCAB, (encoder.BATCH, encoder.SEQ))} for _ in range(2)],
        ),
        "encoder2": (enc2, [{"x": rng.standard_normal(shapes["x"]).astype(np.float32)} for _ in range(2)]),
        "vad": (
            vad_model(tmp / "vad.onnx"),
            [
                {
                    "input": rng.uniform(-0.5, 0.5, (1, 512)).astype(np.float32),
                    "state": np.zeros((2, 1, 128), np.float32),
                    "sr": np.array(16000, np.int64),
                }
                for _ in range(2)
            ],
        ),
    }


def _order_faults(model: onnx.ModelProto) -> list[str]:
    """Names read before anything defines them, and names defined twice (graph and subgraphs)."""
    faults: list[str] = []

    def walk(graph: onnx.GraphProto, outer: set[str]) -> None:
        known = outer | {i.name for i in graph.input} | {i.name for i in graph.initializer}
        for node in graph.node:
            faults.extend(f"{node.name}: reads {x}" for x in node.input if x and x not in known)
            for attr in node.attribute:
                for sub in [attr.g] * attr.HasField("g") + list(attr.graphs):
                    walk(sub, known)
            faults.extend(f"{node.name}: redefines {o}" for o in node.output if o in known)
            known.update(node.output)

    walk(model.graph, set())
    return faults


def _fp16_left(model: onnx.ModelProto) -> list[str]:
    """Where an fp16 type survives: initializers, tensor attributes, Cast targets, value infos (subgraphs too)."""
    found: list[str] = []

    def walk(graph: onnx.GraphProto) -> None:
        found.extend(i.name for i in graph.initializer if i.data_type == TensorProto.FLOAT16)
        found.extend(
            v.name
            for v in list(graph.value_info) + list(graph.input) + list(graph.output)
            if v.type.tensor_type.elem_type == TensorProto.FLOAT16
        )
        for node in graph.node:
            for attr in node.attribute:
                if (attr.HasField("t") and attr.t.data_type == TensorProto.FLOAT16) or (
                    node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT16
                ):
                    found.append(node.name)
                for sub in [attr.g] * attr.HasField("g") + list(attr.graphs):
                    walk(sub)

    walk(model.graph)
    return found


def _scale_faults(model: onnx.ModelProto) -> list[str]:
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return [
        n.name
        for n in model.graph.node
        if n.op_type in ("QuantizeLinear", "DequantizeLinear")
        and n.input[1] in inits
        and not np.all(inits[n.input[1]].astype(np.float64) > 0)
    ]


@pytest.mark.parametrize("name", ["efficientnet", "encoder", "encoder2", "vad"])
@pytest.mark.parametrize(
    "options", VARIANTS, ids=lambda o: f"{o.precision}-{o.keep_fp32}-{'trt' if o.tensorrt_qdq else 'ort'}"
)
def test_every_variant_is_checked_sorted_and_runs(
    name: str, options: VariantOptions, models: dict, tmp_path_factory: pytest.TempPathFactory
) -> None:
    source, feeds = models[name]
    path = make_variant(source, options, feeds, tmp_path_factory.getbasetemp() / "variants")
    # bf16 Conv/MatMul are typed only from opset 22; the variant keeps the model's opset (TensorRT takes
    # bf16 there), so strict type inference is skipped for bf16 alone.
    onnx.checker.check_model(str(path), full_check=options.precision != "bf16")
    model = onnx.load(str(path))
    assert _order_faults(model) == []
    assert _scale_faults(model) == []
    if options.precision in ("fp16", "bf16"):
        assert any(n.op_type == "Cast" for n in model.graph.node)
    else:
        assert any(
            n.op_type in ("DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger") for n in model.graph.node
        )
    if options.precision == "bf16":  # no fp16 left anywhere: TensorRT refuses Half meeting BFloat16
        assert _fp16_left(model) == []
    if options.precision != "bf16":  # ONNX Runtime's CPU kernels lack bf16 for most ops
        opts = ort.SessionOptions()
        if options.precision == "fp8_static":  # its Clip/QuantizeLinear fusion rejects fp8 zero points
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        out = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(None, feeds[0])[0]
        assert np.isfinite(out).all()


def _cast(name: str, src: str, dst: str, to: int) -> onnx.NodeProto:
    return helper.make_node("Cast", [src], [dst], name=name, to=to)


def test_repair_drops_duplicate_casts_and_sorts() -> None:
    """ONNX Runtime 1.30's fp16 converter emitted the same Cast once per blocked consumer, appended at the end."""
    nodes = [
        helper.make_node("Softmax", ["x32"], ["a"], name="sm1"),
        helper.make_node("Softmax", ["x32"], ["b"], name="sm2"),
        helper.make_node("Add", ["a", "b"], ["y"], name="add"),
        _cast("c", "x", "x32", TensorProto.FLOAT),
        _cast("c", "x", "x32", TensorProto.FLOAT),
    ]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("x", "y")]
    model = helper.make_model(helper.make_graph(nodes, "g", [vi[0]], [vi[1]]))
    assert problems(model)
    repair(model)
    assert problems(model) == [] and _order_faults(model) == []
    assert [n.name for n in model.graph.node][0] == "c" and len(model.graph.node) == 4
    onnx.checker.check_model(model, full_check=True)


def test_repair_drops_a_zero_scale_qdq_pair_and_keeps_the_value() -> None:
    """A Q/DQ of a constant (fp8 scale from its spread: 0) is removed; the consumer reads the float directly."""
    inits = [
        numpy_helper.from_array(np.array(0.0, np.float32), "pad_value"),
        numpy_helper.from_array(np.array(0.0, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.int8), "z"),
        numpy_helper.from_array(np.array([1, 1], np.int64), "pads"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["pad_value", "s", "z"], ["q"], name="q"),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"], name="dq"),
        helper.make_node("Pad", ["x", "pads", "dq"], ["y"], name="pad"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    assert any("scale" in p for p in problems(model))
    repair(model)
    assert problems(model) == [] and [n.op_type for n in model.graph.node] == ["Pad"]
    assert list(model.graph.node[0].input) == ["x", "pads", "pad_value"]
    assert {i.name for i in model.graph.initializer} == {"pad_value", "pads"}
    out = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.ones(2, np.float32)}
    )[0]
    assert out.tolist() == [0.0, 1.0, 1.0, 0.0]
