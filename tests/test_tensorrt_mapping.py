"""Route -> IBuilderConfig calls and GPT build routes, against stand-ins (TensorRT cannot run here).

`RecordingBuilderConfig` is a stand-in for `trt.IBuilderConfig` that records every property set and
method call; `stand_in_trt` is a stand-in for the `trt` module exposing the enums the backend reads.
Their member names are checked against the real 11.4 bindings' names in test_tensorrt_api.py.
"""

from __future__ import annotations

import enum
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tuner.backends.base import Artifact, BuildError, ModelInfo
from tuner.backends.tensorrt.build import BuildTimeout, TimingCache, configure, gpt_route, make_monitor, network_flags
from tuner.backends.tensorrt.cuda import DeviceFacts
from tuner.backends.tensorrt.gpt import (
    EMPTY,
    RouteRejected,
    compose_route,
    knob_params,
    parse_knob_database,
    study_attrs,
)
from tuner.backends.tensorrt.run import verified_bytes
from tuner.backends.tensorrt.space import trt_space
from tuner.backends.tensorrt.version import Features
from tuner.errors import TunerError
from tuner.study.fingerprint import differences

TRT10, TRT11, RTX = (
    Features("tensorrt", "10.16.1.11"),
    Features("tensorrt", "11.4.0.106"),
    Features("tensorrt_rtx", "1.7.1.116"),
)
DEVICE = DeviceFacts(l2_bytes=60 << 20, free_bytes=2 << 30)
MODEL = ModelInfo(Path("model.onnx"), {"x": (1, 3, 16, 16)})

# A knob database in the documented format (tensorrt.md §1.3), with knob names from the public material.
KNOB_DB = {
    "tuner_version": "2.19.45",
    "tuner_options": [
        {
            "option": "-kgen:codegen:cuda_tile",
            "allowed_values": "-kgen:codegen:cuda_tile=[0|1|2|3]",
            "default_value": "1",
            "help": "cuda tile codegen",
        },
        {"option": "-conv_lowering", "allowed_values": "-conv_lowering=[on|off]", "default_value": "on", "help": ""},
        {
            "option": "-match_ragged_mha",
            "allowed_values": "-match_ragged_mha=[on|off]",
            "default_value": "off",
            "help": "",
        },
        {
            "option": "-cask_fusion:num_tactics",
            "allowed_values": "-cask_fusion:num_tactics=int32_t",
            "default_value": "-1",
            "help": "",
        },
        {"option": "-peep:max", "allowed_values": "-peep:max=...", "default_value": "1", "help": ""},
    ],
}


def stand_in_trt() -> SimpleNamespace:
    """A stand-in for the `trt` module: the enums the backend reads, with TensorRT's member names."""
    return SimpleNamespace(
        BuilderFlag=enum.IntEnum(
            "BuilderFlag", "FP16 BF16 INT8 FP8 TF32 SPARSE_WEIGHTS OBEY_PRECISION_CONSTRAINTS", start=0
        ),
        TacticSource=enum.IntEnum(
            "TacticSource", "CUBLAS CUBLAS_LT CUDNN EDGE_MASK_CONVOLUTIONS JIT_CONVOLUTIONS", start=0
        ),
        TilingOptimizationLevel=enum.IntEnum("TilingOptimizationLevel", "NONE FAST MODERATE FULL", start=0),
        MemoryPoolType=enum.IntEnum("MemoryPoolType", "WORKSPACE", start=0),
        NetworkDefinitionCreationFlag=enum.IntEnum("NetworkDefinitionCreationFlag", "STRONGLY_TYPED", start=0),
        IProgressMonitor=type("IProgressMonitor", (), {"__init__": lambda self: None}),
    )


class RecordingBuilderConfig:
    """A stand-in for IBuilderConfig: records every call; `build_route` may be made to read back altered."""

    def __init__(self, knobs: str = "", rewrite_route: Any = None, accept_tactics: bool = True) -> None:
        self.__dict__.update(
            calls=[], all_build_routes=knobs, _route="", _rewrite=rewrite_route, _accept=accept_tactics
        )

    def __setattr__(self, name: str, value: Any) -> None:
        self.calls.append(("set", name, value))
        if name == "build_route":
            self.__dict__["_route"] = self._rewrite(value) if self._rewrite else value

    @property
    def build_route(self) -> str:
        return self._route

    def set_flag(self, flag: Any) -> None:
        self.calls.append(("set_flag", flag.name))

    def clear_flag(self, flag: Any) -> None:
        self.calls.append(("clear_flag", flag.name))

    def set_memory_pool_limit(self, pool: Any, size: int) -> None:
        self.calls.append(("set_memory_pool_limit", pool.name, size))

    def set_tactic_sources(self, mask: int) -> bool:
        self.calls.append(("set_tactic_sources", mask))
        return self._accept

    def props(self) -> dict[str, Any]:
        """The last value set for each property."""
        return {c[1]: c[2] for c in self.calls if c[0] == "set"}

    def flags(self) -> tuple[set[str], set[str]]:
        """(flags set, flags cleared)."""
        return {c[1] for c in self.calls if c[0] == "set_flag"}, {c[1] for c in self.calls if c[0] == "clear_flag"}


def route_for(features: Features, knobs: Any = EMPTY, **changes: Any) -> dict[str, Any]:
    """The default route of the space with `changes`, conditions applied in order."""
    route: dict[str, Any] = {}
    for p in trt_space(features, MODEL, knobs).params:
        if p.active(route):
            route[p.name] = changes.get(p.name, p.default)
    return route


def configured(features: Features, **changes: Any) -> RecordingBuilderConfig:
    config = RecordingBuilderConfig()
    configure(stand_in_trt(), features, config, route_for(features, **changes), DEVICE)
    return config


@pytest.mark.parametrize("features", [TRT10, TRT11, RTX], ids=["10.16", "11.4", "rtx-1.7"])
def test_default_route_sets_the_documented_defaults(features: Features) -> None:
    config = configured(features)
    props = config.props()
    assert props["builder_optimization_level"] == 3
    assert props["tiling_optimization_level"].name == "NONE"
    assert props["max_num_tactics"] == -1
    assert props["avg_timing_iterations"] == 8
    assert "max_aux_streams" not in props and "l2_limit_for_tiling" not in props  # left to TensorRT's heuristics
    assert not any(c[0] == "set_memory_pool_limit" for c in config.calls)
    assert config.flags() == ({"TF32"}, {"SPARSE_WEIGHTS"})
    trt = stand_in_trt()
    edge_jit = (1 << trt.TacticSource.EDGE_MASK_CONVOLUTIONS) | (1 << trt.TacticSource.JIT_CONVOLUTIONS)
    assert ("set_tactic_sources", edge_jit) in config.calls


def test_every_knob_maps_to_its_call() -> None:
    config = configured(
        TRT11,
        builder_optimization_level=5,
        tiling_optimization_level="MODERATE",
        l2_limit_pct=50,
        max_num_tactics=64,
        max_aux_streams=0,
        workspace_log2=32,
        tf32=False,
        sparse_weights=True,
        avg_timing_iterations=1,
        tactic_edge_mask=False,
        tactic_jit=True,
    )
    props = config.props()
    assert props["builder_optimization_level"] == 5
    assert props["tiling_optimization_level"].name == "MODERATE"
    assert props["l2_limit_for_tiling"] == DEVICE.l2_bytes // 2
    assert props["max_num_tactics"] == 64 and props["max_aux_streams"] == 0 and props["avg_timing_iterations"] == 1
    assert ("set_memory_pool_limit", "WORKSPACE", DEVICE.free_bytes) in config.calls  # 4 GiB clamped to free memory
    assert config.flags() == ({"SPARSE_WEIGHTS"}, {"TF32"})
    assert ("set_tactic_sources", 1 << stand_in_trt().TacticSource.JIT_CONVOLUTIONS) in config.calls


def test_version_gating_of_the_space() -> None:
    names = {f: set(trt_space(f, MODEL, EMPTY).names()) for f in (TRT10, TRT11, RTX, Features("tensorrt", "10.3.0"))}
    assert {"builder_precision", "tactic_cublas", "tactic_cublas_lt", "tactic_cudnn"} <= names[TRT10]
    assert names[TRT11] == names[RTX] and not names[TRT11] & {"builder_precision", "tactic_cublas", "tactic_cudnn"}
    old = names[Features("tensorrt", "10.3.0")]
    assert "max_num_tactics" not in old and "tiling_optimization_level" not in old  # 10.4+ and 10.8+ only
    assert "int8_dynamic" not in trt_space(TRT11, MODEL, EMPTY).param("precision").choices  # ORT-only integer ops


def test_tensorrt_10_precision_flags_and_network_typing() -> None:
    trt = stand_in_trt()
    strong = route_for(TRT10)
    assert network_flags(trt, TRT10, strong) == 1 << trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED
    assert network_flags(trt, TRT11, route_for(TRT11)) == 0 and network_flags(trt, RTX, route_for(RTX)) == 0
    weak = route_for(TRT10, builder_precision="fp16_obey", precision="int8_static")
    assert network_flags(trt, TRT10, weak) == 0
    config = RecordingBuilderConfig()
    configure(trt, TRT10, config, weak, DEVICE)
    assert {"FP16", "OBEY_PRECISION_CONSTRAINTS", "INT8"} <= config.flags()[0]
    assert "FP16" not in configured(TRT11, precision="fp16").flags()[0]  # 11.x: precision is the ONNX variant only


def test_refused_tactic_sources_fail_the_build() -> None:
    config = RecordingBuilderConfig(accept_tactics=False)
    with pytest.raises(BuildError, match="tactic sources"):
        configure(stand_in_trt(), TRT11, config, route_for(TRT11), DEVICE)


def test_bounded_knobs_become_categorical_parameters() -> None:
    db = parse_knob_database(json.dumps(KNOB_DB))
    params = {p.name: p for p in knob_params(db, {})}
    assert set(params) == {
        "knob:-kgen:codegen:cuda_tile",
        "knob:-conv_lowering",
        "knob:-match_ragged_mha",
    }  # unbounded left out
    assert params["knob:-kgen:codegen:cuda_tile"].choices == ("0", "1", "2", "3")
    assert params["knob:-kgen:codegen:cuda_tile"].default == "1"
    assert (
        db.default_route()
        == "-kgen:codegen:cuda_tile=1 -conv_lowering=on -match_ragged_mha=off -cask_fusion:num_tactics=-1 -peep:max=1"
    )


def test_unbounded_knobs_need_explicit_values_from_the_study_file() -> None:
    db = parse_knob_database(json.dumps(KNOB_DB))
    params = {
        p.name: p
        for p in knob_params(
            db, {"gpt_knobs": {"-cask_fusion:num_tactics": [10, 20], "peep:max": 2}, "gpt_select": "listed"}
        )
    }
    assert set(params) == {"knob:-cask_fusion:num_tactics", "knob:-peep:max"}
    assert params["knob:-cask_fusion:num_tactics"].choices == (
        "-1",
        "10",
        "20",
    )  # the default stays: it is the baseline
    assert params["knob:-peep:max"].choices == ("2",)  # a scalar fixes the knob
    with pytest.raises(TunerError, match="unknown knob"):
        knob_params(db, {"gpt_knobs": {"-no_such_knob": [1]}})
    with pytest.raises(TunerError, match="has no value"):
        knob_params(db, {"gpt_knobs": {"-conv_lowering": ["maybe"]}})


def test_route_string_composition_and_read_back() -> None:
    text = json.dumps(KNOB_DB)
    db = parse_knob_database(text)
    route = route_for(TRT11, db, **{"knob:-kgen:codegen:cuda_tile": "3", "knob:-conv_lowering": "off"})
    expected = (
        "-kgen:codegen:cuda_tile=3 -conv_lowering=off -match_ragged_mha=off -cask_fusion:num_tactics=-1 -peep:max=1"
    )
    assert compose_route(db, route) == expected
    config = RecordingBuilderConfig(knobs=text)
    assert gpt_route(TRT11, config, route) == expected
    assert ("set", "build_route", expected) in config.calls
    assert gpt_route(RTX, RecordingBuilderConfig(knobs=""), route_for(RTX)) is None  # RTX: no knobs, no route set


def test_a_route_that_does_not_read_back_is_rejected() -> None:
    text = json.dumps(KNOB_DB)
    route = route_for(TRT11, parse_knob_database(text), **{"knob:-conv_lowering": "off"})
    config = RecordingBuilderConfig(
        knobs=text, rewrite_route=lambda r: r.replace("-conv_lowering=off", "-conv_lowering=on")
    )
    with pytest.raises(RouteRejected, match="conv_lowering=off") as info:
        gpt_route(TRT11, config, route)
    assert info.value.failure_class == "route-rejected"
    reordered = RecordingBuilderConfig(knobs=text, rewrite_route=lambda r: "  ".join(reversed(r.split())))
    gpt_route(TRT11, reordered, route)  # order and spacing are not a rejection


def test_a_changed_knob_database_makes_resume_refuse() -> None:
    old = parse_knob_database(json.dumps(KNOB_DB))
    changed = json.loads(json.dumps(KNOB_DB))
    changed["tuner_options"][0]["allowed_values"] = "-kgen:codegen:cuda_tile=[0|1|2]"
    new = parse_knob_database(json.dumps(changed))
    diff = differences(
        {"space": trt_space(TRT11, MODEL, old).describe()}, {"space": trt_space(TRT11, MODEL, new).describe()}
    )
    assert diff == ["search space differs in knob:-kgen:codegen:cuda_tile"]
    assert study_attrs(old) == {
        "gpt_tuner_version": "2.19.45",
        "gpt_default_build_route": old.default_route(),
        "gpt_knobs": 5,
    }


def test_malformed_knob_database_is_a_clear_error() -> None:
    with pytest.raises(TunerError, match="knob-database JSON"):
        parse_knob_database('{"tuner_version": "1"}')
    assert parse_knob_database("  ") == EMPTY


def test_progress_monitor_cancels_after_the_deadline() -> None:
    trt = stand_in_trt()
    assert make_monitor(trt, None).step_complete("phase", 1) is True
    late = make_monitor(trt, 0.0)  # time.monotonic() is always past 0
    assert late.step_complete("phase", 1) is False and late.cancelled
    assert BuildTimeout.failure_class == "timeout"


class RecordingTimingCacheConfig:
    """A stand-in for the timing-cache members of IBuilderConfig and ITimingCache."""

    def __init__(self) -> None:
        self.loaded: bytes | None = None

    def create_timing_cache(self, data: bytes) -> bytes:
        self.loaded = bytes(data)
        return b"cache:" + bytes(data)

    def set_timing_cache(self, cache: bytes, ignore_mismatch: bool) -> bool:
        return True

    def get_timing_cache(self) -> SimpleNamespace:
        return SimpleNamespace(serialize=lambda: b"timings")


def test_timing_cache_policies(tmp_path: Path) -> None:
    fresh, shared = (
        TimingCache("fresh", tmp_path, "tensorrt 11.4 / H200"),
        TimingCache("shared", tmp_path, "tensorrt 11.4 / H200"),
    )
    first = RecordingTimingCacheConfig()
    shared.attach(first)
    kept = shared.save(first, "a" * 64)
    assert first.loaded == b"" and shared.path.read_bytes() == b"timings"
    assert kept.read_bytes() == b"timings" and kept.name == "a" * 64 + ".cache"  # the engine's own copy, for its export
    second = RecordingTimingCacheConfig()
    shared.attach(second)
    assert second.loaded == b"timings"  # the next build starts from the shared cache
    third = RecordingTimingCacheConfig()
    fresh.attach(third)
    assert third.loaded == b""  # fresh ignores it
    (shared.path).write_bytes(b"older")
    assert (
        fresh.save(third, "b" * 64).read_bytes() == b"timings" and shared.path.read_bytes() == b"older"
    )  # fresh: kept per engine only
    with pytest.raises(BuildError, match="timing_cache"):
        TimingCache("sometimes", tmp_path, "x")


def test_engine_bytes_are_verified_before_deserializing(tmp_path: Path) -> None:
    engine = tmp_path / "engine.plan"
    engine.write_bytes(b"plan bytes")
    artifact = Artifact(engine, 0.1, {"sha256": hashlib.sha256(b"plan bytes").hexdigest()})
    assert verified_bytes(artifact) == b"plan bytes"
    engine.write_bytes(b"plan bytes, altered")
    with pytest.raises(RuntimeError, match="sha256 differs"):
        verified_bytes(artifact)
