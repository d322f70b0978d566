"""The TensorRT export: trtexec.sh and build_engine.py from the builder calls a build recorded (TensorRT cannot run
here).

The calls are recorded the way `build` records them (`configure_recorded` around the recording
stand-in config of test_tensorrt_mapping); the trtexec line is checked against the flags trtexec's own
option parser names (tools/trt_api/trtexec-*.flags.txt, from NVIDIA's samples/common/sampleOptions.cpp),
the Python script against the names of the real 11.4 / 10.16 / RTX 1.7 bindings, and made to configure
the stand-in config with exactly the calls the build made.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from tests.test_tensorrt_mapping import (
    DEVICE,
    KNOB_DB,
    RTX,
    TRT10,
    TRT11,
    RecordingBuilderConfig,
    route_for,
    stand_in_trt,
)
from tuner.backends.base import ExportRequest, ModelInfo
from tuner.backends.tensorrt.build import add_profile, configure_recorded
from tuner.backends.tensorrt.export import build_script, deployment, trtexec_line
from tuner.backends.tensorrt.gpt import EMPTY, parse_knob_database
from tuner.backends.tensorrt.space import trt_space
from tuner.backends.tensorrt.version import Features

REPO = Path(__file__).resolve().parents[1]
LISTS = REPO / "tools" / "trt_api"
sys.path.insert(0, str(LISTS))
from used_names import GPT_ONLY, missing, scan  # noqa: E402

TRTEXEC = {
    "11.4": LISTS / "trtexec-11.1.flags.txt",
    "10.16": LISTS / "trtexec-10.16.flags.txt",
}  # newest trtexec source: 11.1
NAMES = {
    "tensorrt 11.4.0.106": LISTS / "tensorrt-11.4.names.txt",
    "tensorrt 10.16.1.11": LISTS / "tensorrt-10.16.names.txt",
    "tensorrt_rtx 1.7.1.116": LISTS / "tensorrt_rtx-1.7.names.txt",
}
LABELS = {TRT11: "tensorrt 11.4.0.106", TRT10: "tensorrt 10.16.1.11", RTX: "tensorrt_rtx 1.7.1.116"}
PROFILE = {"x": {"min": [1, 3, 16, 16], "opt": [4, 3, 16, 16], "max": [8, 3, 16, 16], "dynamic": True}}


def trtexec_flags(path: Path) -> set[str]:
    return {line.strip() for line in path.read_text().splitlines() if line.startswith("--")}


def recipe(features: Features, knobs: str = "", profile: dict | None = None, **changes: Any) -> tuple[dict, list]:
    """What `build` records for a route with `changes` (JSON round-tripped, as a trial attribute is), and the stand-in's
    calls."""
    db = parse_knob_database(knobs) if knobs else EMPTY
    config = RecordingBuilderConfig(knobs=knobs)
    _, calls = configure_recorded(stand_in_trt(), features, config, route_for(features, db, **changes), DEVICE)
    record = {
        "config": calls,
        "profile": profile or PROFILE,
        "strongly_typed": features.weak_typing and "builder_precision" not in changes,
    }
    return json.loads(json.dumps(record)), config.calls


def flag_names(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def test_the_trtexec_line_spells_every_builder_option_and_the_build_route() -> None:
    knobs = json.dumps(KNOB_DB)
    record, _ = recipe(
        TRT11,
        knobs,
        builder_optimization_level=5,
        tiling_optimization_level="MODERATE",
        l2_limit_pct=50,
        max_num_tactics=64,
        max_aux_streams=0,
        workspace_log2=30,
        tf32=False,
        sparse_weights=True,
        avg_timing_iterations=1,
        tactic_edge_mask=False,
        **{"knob:-conv_lowering": "off"},
    )
    args = trtexec_line(record, LABELS[TRT11], has_cache=True, cuda_graph=True)
    assert args[:3] == ["trtexec", "--onnx=model.onnx", "--saveEngine=rebuilt.plan"]
    assert {
        "--minShapes=x:1x3x16x16",
        "--optShapes=x:4x3x16x16",
        "--maxShapes=x:8x3x16x16",
        "--builderOptimizationLevel=5",
        "--tilingOptimizationLevel=2",
        f"--l2LimitForTiling={DEVICE.l2_bytes // 2}",
        "--maxTactics=64",
        "--maxAuxStreams=0",
        "--memPoolSize=workspace:1024M",
        "--noTF32",
        "--sparsity=enable",
        "--avgTiming=1",
        "--tacticSources=-EDGE_MASK_CONVOLUTIONS,+JIT_CONVOLUTIONS",
        "--timingCacheFile=timing.cache",
    } <= set(args)
    route = next(a for a in args if a.startswith("--setBuildRoute="))
    assert (
        route == "--setBuildRoute=-kgen:codegen:cuda_tile=1 -conv_lowering=off -match_ragged_mha=off "
        "-cask_fusion:num_tactics=-1 -peep:max=1"
    )
    assert flag_names(args) <= trtexec_flags(TRTEXEC["11.4"])
    assert "--noCudaGraph" in trtexec_line(
        record, LABELS[TRT11], has_cache=False, cuda_graph=False
    )  # timed without a graph


def test_tensorrt_10_gets_its_precision_flags_and_the_timing_flags_11_made_defaults() -> None:
    record, _ = recipe(TRT10, builder_precision="fp16_obey", precision="int8_static", tactic_cublas=True)
    args = trtexec_line(record, LABELS[TRT10], has_cache=False, cuda_graph=True)
    assert {
        "--fp16",
        "--int8",
        "--precisionConstraints=obey",
        "--useCudaGraph",
        "--noDataTransfers",
        "--useSpinWait",
    } <= set(args)
    assert "--tacticSources=+EDGE_MASK_CONVOLUTIONS,+JIT_CONVOLUTIONS,+CUBLAS,-CUBLAS_LT,-CUDNN" in args
    assert not any(a.startswith("--setBuildRoute") for a in args) and flag_names(args) <= trtexec_flags(
        TRTEXEC["10.16"]
    )
    strong, _ = recipe(TRT10)
    assert "--stronglyTyped" in trtexec_line(strong, LABELS[TRT10], False, True)
    assert "--stronglyTyped" not in trtexec_line(recipe(TRT11)[0], LABELS[TRT11], False, True)  # a no-op on 11.x


@pytest.mark.parametrize("features", [TRT11, TRT10, RTX], ids=["11.4", "10.16", "rtx-1.7"])
def test_every_value_of_every_knob_has_a_trtexec_spelling_trtexec_knows(features: Features) -> None:
    knobs = json.dumps(KNOB_DB) if features.gpt_api else ""
    db = parse_knob_database(knobs) if knobs else EMPTY
    known = trtexec_flags(TRTEXEC["10.16" if features.weak_typing else "11.4"])
    tried = 0
    for p in trt_space(features, ModelInfo(Path("m.onnx"), {"x": (1, 3, 16, 16)}), db).params:
        for value in p.choices:
            changes = (
                {"tiling_optimization_level": "FAST", p.name: value} if p.name == "l2_limit_pct" else {p.name: value}
            )
            record, _ = recipe(features, knobs, **changes)
            assert flag_names(trtexec_line(record, LABELS[features], True, True)) <= known, (p.name, value)
            tried += 1
    assert tried > 30


def test_only_inputs_the_network_leaves_dynamic_get_shapes() -> None:
    static = {"x": {"min": [1, 3, 16, 16], "opt": [1, 3, 16, 16], "max": [1, 3, 16, 16], "dynamic": False}}
    record, _ = recipe(TRT11, profile=static)
    assert not any(
        "Shapes=" in a for a in trtexec_line(record, LABELS[TRT11], False, True)
    )  # trtexec refuses them for a static network
    network = SimpleNamespace(
        num_inputs=2,
        get_input=lambda i: [SimpleNamespace(name="x", shape=(-1, 3, 16, 16)), SimpleNamespace(name="sr", shape=())][i],
    )
    shapes: list = []
    profile = SimpleNamespace(set_shape=lambda *a: shapes.append(a))
    builder = SimpleNamespace(create_optimization_profile=lambda: profile)
    config = SimpleNamespace(add_optimization_profile=lambda p: shapes.append("added"))
    recorded = add_profile(builder, network, config, [({"x": (4, 3, 16, 16), "sr": ()}, 1.0)])
    assert recorded == {
        "x": {"min": [4, 3, 16, 16], "opt": [4, 3, 16, 16], "max": [4, 3, 16, 16], "dynamic": True},
        "sr": {"min": [], "opt": [], "max": [], "dynamic": False},
    }
    assert shapes == [("x", (4, 3, 16, 16), (4, 3, 16, 16), (4, 3, 16, 16)), ("sr", (), (), ()), "added"]


def _recorded_profile(model: ModelInfo) -> tuple[dict, list]:
    """What `add_profile` records and sets for `model`'s shapes on a network whose input x has a dynamic batch."""
    network = SimpleNamespace(num_inputs=1, get_input=lambda i: SimpleNamespace(name="x", shape=(-1, 3, 16, 16)))
    shapes: list = []
    profile = SimpleNamespace(set_shape=lambda *a: shapes.append(a))
    recorded = add_profile(
        SimpleNamespace(create_optimization_profile=lambda: profile),
        network,
        SimpleNamespace(add_optimization_profile=lambda p: None),
        model.served(),
    )
    return recorded, shapes


def test_a_two_shape_study_builds_one_profile_covering_both_and_rebuilds_it_with_trtexec() -> None:
    """[[objective.shapes]] at batch 1 (weight 0.7) and batch 8 (0.3): min batch 1, max batch 8, opt the heavier."""
    model = ModelInfo(
        Path("m.onnx"),
        {"x": (1, 3, 16, 16)},
        shapes=(({"x": (1, 3, 16, 16)}, 0.7), ({"x": (8, 3, 16, 16)}, 0.3)),
    )
    recorded, shapes = _recorded_profile(model)
    assert shapes == [("x", (1, 3, 16, 16), (1, 3, 16, 16), (8, 3, 16, 16))]
    assert recorded == {"x": {"min": [1, 3, 16, 16], "opt": [1, 3, 16, 16], "max": [8, 3, 16, 16], "dynamic": True}}
    heavier_8 = ModelInfo(model.path, model.input_shapes, shapes=((model.shapes[0][0], 0.2), model.shapes[1]))
    assert _recorded_profile(heavier_8)[1] == [("x", (1, 3, 16, 16), (8, 3, 16, 16), (8, 3, 16, 16))]
    record, _ = recipe(TRT11, json.dumps(KNOB_DB), profile=recorded, **{"knob:-conv_lowering": "off"})
    args = trtexec_line(record, LABELS[TRT11], has_cache=True, cuda_graph=True)
    assert {"--minShapes=x:1x3x16x16", "--optShapes=x:1x3x16x16", "--maxShapes=x:8x3x16x16"} <= set(args)
    assert any(a.startswith("--setBuildRoute=") and "-conv_lowering=off" in a for a in args)
    assert flag_names(args) <= trtexec_flags(TRTEXEC["11.4"])


def _script_module(text: str, tmp_path: Path) -> ModuleType:
    path = tmp_path / "build_engine.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("exported_build_engine", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports no TensorRT at the top: the build is in main()
    return module


@pytest.mark.parametrize("features", [TRT11, TRT10, RTX], ids=["11.4", "10.16", "rtx-1.7"])
def test_build_engine_py_makes_the_recorded_calls_and_uses_only_real_binding_names(
    features: Features, tmp_path: Path
) -> None:
    knobs = json.dumps(KNOB_DB) if features.gpt_api else ""
    changes = {"builder_optimization_level": 4, "workspace_log2": 28, "tf32": False, "tactic_jit": False}
    if features.gpt_api:
        changes["knob:-kgen:codegen:cuda_tile"] = "3"
    if features.weak_typing:
        changes["builder_precision"] = "bf16"
    record, made = recipe(features, knobs, **changes)
    text = build_script(record, LABELS[features], has_cache=True)
    replayed = RecordingBuilderConfig(knobs=knobs)
    module = _script_module(text, tmp_path)
    module.configure(stand_in_trt(), replayed)
    assert replayed.calls == made  # the script configures the builder exactly as the measured build did
    shapes: list = []
    module.add_profile(
        None,
        SimpleNamespace(create_optimization_profile=lambda: SimpleNamespace(set_shape=lambda *a: shapes.append(a))),
        SimpleNamespace(add_optimization_profile=lambda p: None),
    )
    assert shapes == [("x", (1, 3, 16, 16), (4, 3, 16, 16), (8, 3, 16, 16))]
    names = NAMES[LABELS[features]]
    assert missing(scan(text) - (GPT_ONLY if not features.gpt_api else set()), names) == []
    assert f"import {features.flavor} as trt" in text


def test_the_deployment_writes_the_engine_its_onnx_the_timing_cache_and_both_scripts(tmp_path: Path) -> None:
    record, _ = recipe(TRT11, json.dumps(KNOB_DB), max_aux_streams=2)
    (tmp_path / "variant.onnx").write_bytes(b"onnx")
    (tmp_path / "kept.cache").write_bytes(b"timings")
    record.update(variant_path=str(tmp_path / "variant.onnx"), timing_cache_file=str(tmp_path / "kept.cache"))
    request = ExportRequest(
        route={},
        artifact=tmp_path / "abc.plan",
        build_info={"trt": LABELS[TRT11], "builder": record},
        model=ModelInfo(tmp_path / "m.onnx", {"x": (4, 3, 16, 16)}, {"cuda_graph": False}),
        work_dir=tmp_path,
        backend_version=LABELS[TRT11],
        inputs={},
        shapes=[],
    )
    d = deployment(request)
    assert d.artifact_name == "engine.plan" and set(d.files) == {
        "trtexec.sh",
        "build_engine.py",
        "model.onnx",
        "timing.cache",
    }
    assert d.files["model.onnx"] == tmp_path / "variant.onnx" and d.files["timing.cache"] == tmp_path / "kept.cache"
    script = str(d.files["trtexec.sh"])
    assert 'cd "$(dirname "$0")"' in script and str(tmp_path) not in script
    line = shlex.split(script.split("\n", 4)[4].replace("\\\n", " "))
    assert "--maxAuxStreams=2" in line and "--timingCacheFile=timing.cache" in line and "--noCudaGraph" in line
    assert d.commands == [
        "trtexec --loadEngine=engine.plan --shapes=x:4x3x16x16 --noCudaGraph"
    ]  # times the shipped engine
    assert "trtexec on PATH" in d.needs
    old = deployment(
        ExportRequest(
            route={},
            artifact=tmp_path / "abc.plan",
            build_info={"trt": LABELS[TRT11]},
            model=request.model,
            work_dir=tmp_path,
            backend_version="",
            inputs={},
            shapes=[],
        )
    )
    assert old.files == {} and "before the tuner recorded" in old.notes[0]
