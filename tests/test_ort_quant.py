"""ONNX Runtime int8 routes: ORT's own knobs and recommendations, model preparation, failures learned once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import optuna
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import REPO, run_study
from tests.helpers import status, trial_dir, trials
from tests.models import vad_model
from tuner.backends.base import BuildContext, ModelInfo
from tuner.backends.onnxruntime import OnnxRuntimeBackend
from tuner.backends.onnxruntime.quant_space import recommendation
from tuner.backends.onnxruntime.quantize import outer_scope_producers
from tuner.backends.onnxruntime.space import recommended_route
from tuner.precision import VariantOptions, make_variant
from tuner.store.urls import normalize_url

RNG = np.random.default_rng(3)


def feeds(shape: tuple[int, ...], n: int = 4) -> list[dict[str, np.ndarray]]:
    return [{"x": RNG.normal(size=shape).astype(np.float32)} for _ in range(n)]


def paddle_like(path: Path) -> Path:
    """An opset-12 CNN as paddle2onnx writes it: one Conv weight from a Constant node, one through an Identity."""
    w1 = numpy_helper.from_array(RNG.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "conv2d_0.w_0")
    w2 = numpy_helper.from_array(RNG.normal(0, 0.2, (8, 8, 3, 3)).astype(np.float32), "conv2d_1.w_0.raw")
    b1 = numpy_helper.from_array(RNG.normal(0, 0.1, (8,)).astype(np.float32), "conv2d_0.b_0")
    fc = numpy_helper.from_array(RNG.normal(0, 0.3, (8, 10)).astype(np.float32), "fc.w")
    nodes = [
        helper.make_node("Constant", [], ["conv2d_0.w_0c"], value=w1),
        helper.make_node("Conv", ["x", "conv2d_0.w_0c", "conv2d_0.b_0"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Identity", ["conv2d_1.w_0.raw"], ["conv2d_1.w_0"]),
        helper.make_node("Conv", ["r1", "conv2d_1.w_0"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Squeeze", ["g"], ["s"], axes=[2, 3]),  # opset 12: axes is an attribute (an input from 13)
        helper.make_node("MatMul", ["s", "fc.w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "paddle_like",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [w2, b1, fc],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def weight_input_model(path: Path) -> Path:
    """A CNN whose Conv weight is a graph input: no preparation makes it an initializer, so dynamic int8 fails (its
    bias)."""
    fc = numpy_helper.from_array(RNG.normal(0, 0.3, (4, 10)).astype(np.float32), "fc.w")
    bias = numpy_helper.from_array(RNG.normal(0, 0.1, (4,)).astype(np.float32), "b")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "fc.w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "weight_input",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3, 3, 3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [fc, bias],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def build_and_run(model: Path, route_changes: dict, work: Path, data: list[dict[str, np.ndarray]]) -> tuple[dict, Path]:
    backend = OnnxRuntimeBackend()
    info = ModelInfo(model, {name: tuple(value.shape) for name, value in data[0].items()})
    space = backend.space(info)
    route = space.complete(route_changes)
    assert space.contains(route), route
    ctx = BuildContext(info, work, work / "out", data, None, lambda _: None)
    artifact = backend.build(route, ctx)
    runner = backend.load(artifact, route, ctx)
    return runner.infer(data[0]), work / "variants" / artifact.info["variant"]


def test_recommendations_follow_onnxruntime_guidance() -> None:
    def pick(machine: str, flags: set[str]) -> tuple[str, bool]:
        r = recommendation(machine, frozenset(flags))
        return r.quant_types, r.reduce_range

    assert pick("x86_64", {"avx2"}) == ("U8S8", True)  # no VNNI: 7-bit weights
    assert pick("x86_64", {"avx2", "avx512_vnni"}) == ("U8S8", False)
    assert pick("aarch64", set()) == ("S8S8", False)


def test_int8_knobs_are_conditional(tiny_model: Path) -> None:
    space = OnnxRuntimeBackend().space(ModelInfo(tiny_model, {"x": (1, 3, 16, 16)}))
    routes = space.routes()
    static = [r for r in routes if r["precision"] == "int8_static"]
    assert static and all(
        "graph_optimization_level" not in r and r["int8_graph_level"] in ("all", "extended") for r in static
    )
    assert not any(r.get("quant_types") == "S8S8" and "quant_format" in r for r in routes)  # S8S8 only as Q/DQ
    assert all(("percentile" in r) == (r.get("calibration") == "percentile") for r in routes)
    assert {r["quant_ops"] for r in static} == {"all", "Conv", "Gemm"}  # the op types this model has
    assert not any("quant_types" in r or "fp32_nodes" in r for r in routes if r["precision"] != "int8_static")
    assert space.contains(recommended_route(space)) and not space.contains(
        {**recommended_route(space), "graph_optimization_level": "all"}
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"precision": "int8_static"},
        {"precision": "int8_static", "quant_types": "S8S8", "fp32_nodes": 2},
        {
            "precision": "int8_static",
            "quant_types": "U8U8",
            "quant_format": "qoperator",
            "calibration": "percentile",
            "percentile": 99.99,
        },
        {"precision": "int8_static", "calibration": "entropy", "quant_ops": "Conv", "activation_symmetric": True},
        {"precision": "int8_dynamic", "weight_type": "U8"},
    ],
)
def test_int8_recipes_build_run_and_are_content_addressed(tiny_model: Path, tmp_path: Path, changes: dict) -> None:
    data = feeds((1, 3, 16, 16))
    ref = build_and_run(tiny_model, {}, tmp_path / "ref", data)[0]["y"]
    out, variant = build_and_run(tiny_model, changes, tmp_path / "w", data)
    cos = float(np.dot(out["y"].ravel(), ref.ravel()) / np.linalg.norm(out["y"]) / np.linalg.norm(ref))
    assert cos > 0.98
    ops = {n.op_type for n in onnx.load(str(variant)).graph.node}
    assert ops & {"QuantizeLinear", "QLinearConv", "ConvInteger", "DynamicQuantizeLinear", "MatMulInteger"}
    again = build_and_run(tiny_model, changes, tmp_path / "w", data)[1]
    assert again == variant and variant.stat().st_mtime_ns == again.stat().st_mtime_ns  # made once, reused


def test_mixed_precision_keeps_the_most_sensitive_nodes_in_fp32_measured_once(tiny_model: Path, tmp_path: Path) -> None:
    data = feeds((1, 3, 16, 16))
    _, v2 = build_and_run(tiny_model, {"precision": "int8_static", "fp32_nodes": 2}, tmp_path, data)
    sens = list((tmp_path / "variants").glob("sensitivity.*.json"))
    assert len(sens) == 1
    ranking = json.loads(sens[0].read_text())["ranking"]
    _, v1 = build_and_run(
        tiny_model, {"precision": "int8_static", "fp32_nodes": 1, "quant_types": "S8S8"}, tmp_path, data
    )
    assert list((tmp_path / "variants").glob("sensitivity.*.json")) == sens  # the pass ran once for both recipes
    for variant, kept in ((v2, ranking[:2]), (v1, ranking[:1])):
        graph = onnx.load(str(variant)).graph
        inits = {i.name for i in graph.initializer}
        dq_weights = {
            o for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits for o in n.output
        }
        quantized = {n.name for n in graph.node if set(n.input) & dq_weights}  # nodes with int8 weights
        assert set(kept).isdisjoint(quantized) and len(quantized) == 3 - len(kept), (
            kept,
            quantized,
        )  # 3 weighted nodes


@pytest.mark.parametrize("quant_types", ["U8S8", "U8U8"])
def test_qoperator_keeps_a_tensor_an_if_branch_reads_from_the_outer_scope(tmp_path: Path, quant_types: str) -> None:
    # ONNX Runtime's QOperator quantizer drops `proj` (read only inside the If's branches): without the
    # producer kept in fp32 the variant fails to load ("unknown initializers/tensors {'proj'}")
    model = vad_model(tmp_path / "vad.onnx")
    data = [
        {
            "input": RNG.uniform(-0.5, 0.5, (1, 512)).astype(np.float32),
            "state": np.zeros((2, 1, 128), np.float32),
            "sr": np.array(16000, np.int64),
        }
        for _ in range(4)
    ]
    assert outer_scope_producers(_named(model)) == ["MatMul_0"]
    ref = build_and_run(model, {}, tmp_path / "ref", data)[0]["output"]
    out, variant = build_and_run(
        model,
        {"precision": "int8_static", "quant_types": quant_types, "quant_format": "qoperator", "quant_ops": "all"},
        tmp_path / "w",
        data,
    )
    assert np.allclose(out["output"], ref, atol=0.05)
    graph = onnx.load(str(variant)).graph
    assert any(n.op_type == "QLinearMatMul" for n in graph.node) and any(
        o == "proj" for n in graph.node for o in n.output
    )


def _named(model: Path) -> onnx.ModelProto:
    proto = onnx.load(str(model))
    for i, node in enumerate(proto.graph.node):
        node.name = node.name or f"{node.op_type}_{i}"
    return proto


def test_opset12_model_with_constant_and_identity_weights_gets_int8_variants(tmp_path: Path) -> None:
    model = paddle_like(tmp_path / "rec.onnx")
    data = feeds((1, 3, 16, 16))
    with pytest.raises(
        ValueError, match="Expected conv2d_0.w_0c to be an initializer"
    ):  # ORT's quantizer on the raw model
        make_variant(model, VariantOptions("int8_dynamic"), data, tmp_path / "plain")
    with pytest.raises(Exception, match="INVALID_GRAPH|Unrecognized attribute: axis"):  # per-channel Q/DQ at opset 12
        unprepared = make_variant(model, VariantOptions("int8_static"), data, tmp_path / "plain")
        ort.InferenceSession(str(unprepared), providers=["CPUExecutionProvider"])
    ref = build_and_run(model, {}, tmp_path / "ref", data)[0]["y"]
    for changes in (
        {"precision": "int8_dynamic"},
        {"precision": "int8_static"},
        {"precision": "int8_static", "quant_format": "qoperator"},
    ):
        out, variant = build_and_run(model, changes, tmp_path / "w", data)
        assert np.all(np.isfinite(out["y"])) and out["y"].shape == ref.shape
        assert next(o.version for o in onnx.load(str(variant)).opset_import if o.domain in ("", "ai.onnx")) >= 13
    steps = {
        s["step"]: s
        for s in json.loads(next((tmp_path / "w" / "variants").glob("rec.prepared.*.json")).read_text())["steps"]
    }
    assert (
        steps["initializers"]["status"] == "done"
        and "1 Constant" in steps["initializers"]["detail"]
        and "1 Identity" in steps["initializers"]["detail"]
    )
    assert steps["opset"]["detail"] == "opset 12 -> 13" and steps["quant_pre_process"]["status"] == "done"


def test_opset12_study_builds_int8_and_shows_its_preparation(cli, write_spec, sqlite_url, tmp_path: Path) -> None:
    model = paddle_like(tmp_path / "rec.onnx")
    spec = write_spec(
        **{
            "model.path": str(model),
            "run.budget": 4,
            "accuracy.tolerance": 0.05,
            "backend.space": {"precision": ["fp32", "int8_static", "int8_dynamic"], "intra_op_threads": [0, 1]},
        }
    )
    run_study(spec, sqlite_url)
    ts = [t for t in trials(sqlite_url, "tiny") if t.state.is_finished()]
    int8 = [t for t in ts if str(t.params["precision"]).startswith("int8")]
    assert int8 and all(t.user_attrs["failure_class"] not in ("build-error", "known-failure") for t in int8)
    assert any(t.user_attrs.get("source") == "recommended" for t in int8)  # ORT's recipe, right after the baseline
    shown = cli("space", str(spec))
    assert shown.returncode == 0, shown.stderr
    assert "opset: done opset 12 -> 13" in shown.stdout and "initializers: done" in shown.stdout
    s = status(cli("status", str(spec), "--storage", sqlite_url, "--json"))
    assert s["repeated_failures_share"] <= 0.1


def test_a_failed_variant_is_learned_once_and_costs_no_budget(cli, write_spec, pg_url, tmp_path: Path) -> None:
    model = weight_input_model(tmp_path / "wi.onnx")
    space = {
        "precision": ["fp32", "int8_dynamic"],
        "graph_optimization_level": ["all", "extended", "basic", "disabled"],
        "intra_op_threads": [0, 1],
        "reduce_range": [True, False],
        "per_channel": [True],
        "weight_type": ["S8"],
        "quant_ops": ["all"],
    }
    spec = write_spec(
        **{
            "model.path": str(model),
            "model.inputs": {"x": {"shape": [1, 3, 8, 8]}, "w": {"shape": [4, 3, 3, 3]}},
            "run.budget": 10,
            "run.sampler": "random",
            "backend.space": space,
        }
    )
    run_study(spec, pg_url, 1)  # the default route only
    study = optuna.load_study(study_name="tiny", storage=normalize_url(pg_url))
    for level in ("all", "basic"):  # two routes that need one int8 variant, for sure (not left to the random sampler)
        study.enqueue_trial(
            {
                "precision": "int8_dynamic",
                "graph_optimization_level": level,
                "intra_op_threads": 0,
                "reduce_range": True,
                "per_channel": True,
                "weight_type": "S8",
                "quant_ops": "all",
            }
        )
    run_study(spec, pg_url)
    ts = [t for t in trials(pg_url, "tiny") if t.state.is_finished()]
    dyn = sorted((t for t in ts if t.params["precision"] == "int8_dynamic"), key=lambda t: t.number)
    by_rr = {rr: [t for t in dyn if t.params["reduce_range"] == rr] for rr in (True, False)}
    for group in by_rr.values():  # one variant per reduce_range value: built (and failed) once, then known
        if group:
            assert (
                group[0].user_attrs["failure_class"] == "build-error"
                and "initializer" in group[0].user_attrs["message"]
            )
            assert all(t.user_attrs["failure_class"] == "known-failure" for t in group[1:]), [
                (t.number, t.user_attrs["failure_class"]) for t in group
            ]
            assert len({t.user_attrs["failure_key"] for t in group}) == 1
    assert len(by_rr[True]) >= 2  # the enqueued pair: the second one never built
    known = [t for t in dyn if t.user_attrs["failure_class"] == "known-failure"]
    assert all(
        not trial_dir(pg_url, "tiny", tmp_path / ".tuner" / "tiny", t.number).exists() for t in known
    )  # no child
    s = status(cli("status", str(spec), "--storage", pg_url, "--json"))
    assert s["repeated_failures"] == 0 and s["repeated_failures_share"] == 0.0
    assert (
        len(ts) - len(known) + max(0, len(known) - 10) == 10
    )  # the budget counts trials that ran; known failures are free up to 10


PREPARE = """import sys
from pathlib import Path
if sys.argv[3] == "torch-first":
    import torch  # noqa: F401  (as in a process that has it loaded already)
from tuner.backends.onnxruntime.prepare import prepare
done = prepare(Path(sys.argv[1]), "key", Path(sys.argv[2]), lambda line: None)
print(done.steps[-1]["detail"], "torch" in sys.modules)
"""


def test_preparation_runs_symbolic_shape_inference_without_importing_torch(tiny_model: Path, tmp_path: Path) -> None:
    """onnxruntime.tools would import torch where it is installed; the prepared model is the same either way."""
    pytest.importorskip("torch", reason="only where torch is installed does onnxruntime.tools import it")
    outputs = {}
    for mode in ("plain", "torch-first"):
        run = subprocess.run(
            [sys.executable, "-c", PREPARE, str(tiny_model), str(tmp_path / mode), mode],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=300,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        outputs[mode] = run.stdout.split()
        (prepared,) = (tmp_path / mode).glob("*.prepared.key.onnx")
        outputs[mode].append(prepared.read_bytes())
    assert outputs["plain"][:2] == ["full", "False"]  # symbolic shape inference ran, and torch was never imported
    assert outputs["torch-first"][:2] == ["full", "True"]
    assert outputs["plain"][2] == outputs["torch-first"][2]


FALLBACK = """import sys
from pathlib import Path
sys.modules["sympy"] = None  # as where sympy is not installed: the import system refuses it
from tuner.backends.onnxruntime.prepare import prepare
lines = []
prepare(Path(sys.argv[1]), "key", Path(sys.argv[2]), lines.append)
print(lines[-1])
"""


def test_a_preparation_that_falls_back_says_why_in_one_line(tiny_model: Path, tmp_path: Path) -> None:
    """Without sympy, symbolic shape inference cannot run: the step falls back and its one line names the reason."""
    run = subprocess.run(
        [sys.executable, "-c", FALLBACK, str(tiny_model), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    line = run.stdout.strip()
    assert line.startswith(
        "preparation quant_pre_process: done without symbolic shape inference (full: ImportError: "
    ), line
    assert "sympy" in line and "\n" not in line
    (record,) = tmp_path.glob("*.prepared.key.json")
    assert (
        "sympy" in json.loads(record.read_text())["steps"][-1]["detail"]
    )  # stored with the study, shown by `tuner space`
