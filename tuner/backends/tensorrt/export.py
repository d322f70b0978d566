"""TensorRT's native reproduction of a trial: the engine plan, the ONNX file it was built from, the timing cache
it was built with, `trtexec.sh` (the trtexec line that rebuilds it) and `build_engine.py` (the same build
through the TensorRT Python API).

Both scripts are rendered from the builder-config calls the build recorded (`recipe.RecordingConfig`,
kept in the trial's `build_info["builder"]`), so they say exactly what the measured engine was built
with, and they are written without TensorRT. Each kind of call has one trtexec spelling (`SETTINGS`,
`FLAGS`, checked against the flags of trtexec's own option parser in tools/trt_api/) and one line of
Python; a call without a spelling stops the export rather than leave a knob out.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.backends.base import Deployment, ExportRequest
from tuner.backends.tensorrt.options import CUDA_GRAPH
from tuner.backends.tensorrt.recipe import Call, enum_name
from tuner.backends.tensorrt.space import LEGACY_TACTICS, TACTICS, TILING
from tuner.backends.tensorrt.version import Features
from tuner.errors import TunerError

ENGINE, MODEL, CACHE, REBUILT = "engine.plan", "model.onnx", "timing.cache", "rebuilt.plan"
# IBuilderConfig property -> trtexec flag taking its value as it is.
SETTINGS = {
    "builder_optimization_level": "--builderOptimizationLevel",
    "max_num_tactics": "--maxTactics",
    "max_aux_streams": "--maxAuxStreams",
    "avg_timing_iterations": "--avgTiming",
    "l2_limit_for_tiling": "--l2LimitForTiling",
    "build_route": "--setBuildRoute",
}
# (set_flag | clear_flag, BuilderFlag member) -> trtexec flags (none where it is trtexec's default).
FLAGS = {
    ("set_flag", "TF32"): [],
    ("clear_flag", "TF32"): ["--noTF32"],
    ("set_flag", "SPARSE_WEIGHTS"): ["--sparsity=enable"],
    ("clear_flag", "SPARSE_WEIGHTS"): [],
    ("set_flag", "FP16"): ["--fp16"],
    ("set_flag", "BF16"): ["--bf16"],
    ("set_flag", "INT8"): ["--int8"],
    ("set_flag", "FP8"): ["--fp8"],
    ("set_flag", "OBEY_PRECISION_CONSTRAINTS"): ["--precisionConstraints=obey"],
}
POOLS = {"WORKSPACE": "workspace", "TACTIC_SHARED_MEMORY": "tacticSharedMem"}  # MemoryPoolType -> trtexec's pool name


def features_of(label: str) -> Features:
    """The Features of a recorded label such as 'tensorrt 11.4.0.106'."""
    flavor, _, version = label.partition(" ")
    return Features(flavor, version)


def _size(n: int) -> str:
    return f"{n >> 20}M" if n % (1 << 20) == 0 else f"{n}B"


def _dims(shape: list[int]) -> str:
    return "x".join(str(d) for d in shape)


def shape_flags(inputs: Mapping[str, Mapping[str, Any]], kinds: tuple[str, ...] = ("min", "opt", "max")) -> list[str]:
    """--minShapes/--optShapes/--maxShapes (kind "run": --shapes at opt) for the inputs the network leaves dynamic.

    trtexec refuses shapes for inputs the network fixes ("Static model does not take explicit shapes").
    """
    dynamic = {name: p for name, p in inputs.items() if p.get("dynamic")}
    flags = {
        "min": ("--minShapes", "min"),
        "opt": ("--optShapes", "opt"),
        "max": ("--maxShapes", "max"),
        "run": ("--shapes", "opt"),
    }
    out = []
    for kind in kinds if dynamic else ():
        flag, key = flags[kind]
        out.append(f"{flag}=" + ",".join(f"{name}:{_dims(p[key])}" for name, p in dynamic.items()))
    return out


def sources(features: Features) -> list[str]:
    """The tactic sources this TensorRT has, by TacticSource member name."""
    return [*TACTICS.values(), *(LEGACY_TACTICS.values() if features.legacy_tactics else ())]


def trtexec_flags(call: Call, features: Features) -> list[str]:
    """trtexec's spelling of one recorded builder-config call."""
    op, name, value = call
    if op == "set" and name in SETTINGS:
        return [f"{SETTINGS[name]}={value}"]
    if op == "set" and name == "tiling_optimization_level":
        return [f"--tilingOptimizationLevel={TILING.index(str(enum_name(value)))}"]
    if op == "call" and (name, enum_name(value[0])) in FLAGS:
        return FLAGS[(name, str(enum_name(value[0])))]
    if op == "call" and name == "set_memory_pool_limit" and enum_name(value[0]) in POOLS:
        return [f"--memPoolSize={POOLS[str(enum_name(value[0]))]}:{_size(int(value[1]))}"]
    if op == "call" and name == "set_tactic_sources":
        enabled = set(value[0]["tactic_sources"])
        return ["--tacticSources=" + ",".join(("+" if s in enabled else "-") + s for s in sources(features))]
    raise TunerError(
        f"no trtexec spelling for the builder call {call!r}; not exporting a trtexec line that would leave it out"
    )


def _python(value: Any) -> str:
    return f"trt.{value['enum']}" if enum_name(value) is not None else repr(value)


def python_lines(call: Call) -> list[str]:
    """The TensorRT Python API line(s) of one recorded builder-config call."""
    op, name, value = call
    if op == "set":
        lines = [f"config.{name} = {_python(value)}"]
        if name == "build_route":  # the setter discards TensorRT's verdict: read it back
            lines += [
                f"if sorted(config.build_route.split()) != sorted({value!r}.split()):",
                "    raise SystemExit('TensorRT did not take the build route')",
            ]
        return lines
    if name == "set_tactic_sources":
        mask = " | ".join(f"1 << int(trt.TacticSource.{s})" for s in value[0]["tactic_sources"]) or "0"
        return [
            f"if not config.set_tactic_sources({mask}):",
            "    raise SystemExit('TensorRT refused the tactic sources')",
        ]
    return [f"config.{name}({', '.join(_python(v) for v in value)})"]


BUILD_SCRIPT = '''#!/usr/bin/env python3
"""Rebuild the exported engine through the TensorRT Python API, with the builder calls the measured build \
made ({label}).

    python3 build_engine.py [OUT.plan]    (default {rebuilt}, beside this file; needs the `{module}` Python package)

It parses {model} (the ONNX file {engine} was built from), configures the builder as the measured
build did, starts from {cache}{cache_note}, and writes the plan. A rebuild times tactics anew and can
differ from {engine}: deploy {engine} itself.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def configure(trt, config):
    """The builder configuration the route was measured with."""
{configure}


def add_profile(trt, builder, config):
    """One optimization profile: the shapes the route was measured at (min, opt, max)."""
    profile = builder.create_optimization_profile()
{profile}
    config.add_optimization_profile(profile)


def main(argv):
    import {module} as trt

    out = argv[0] if argv else os.path.join(HERE, "{rebuilt}")
    logger = trt.Logger(trt.ILogger.Severity.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network({network_flags})
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(os.path.join(HERE, "{model}")):
        errors = [parser.get_error(i) for i in range(parser.num_errors)]
        raise SystemExit("ONNX parser: " + "; ".join(error.desc() for error in errors))
    config = builder.create_builder_config()
    configure(trt, config)
    add_profile(trt, builder, config)
    cached = b""
    if os.path.exists(os.path.join(HERE, "{cache}")):
        with open(os.path.join(HERE, "{cache}"), "rb") as f:
            cached = f.read()
    if not config.set_timing_cache(config.create_timing_cache(cached), False):
        raise SystemExit("TensorRT refused the timing cache")
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise SystemExit("build_serialized_network returned None")
    with open(out, "wb") as f:
        f.write(plan)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1:])
'''


def build_script(recipe: Mapping[str, Any], label: str, has_cache: bool) -> str:
    """build_engine.py for a recorded build."""
    body = [line for call in recipe["config"] for line in python_lines(call)] or ["pass"]
    profile = [
        f"profile.set_shape({name!r}, {tuple(p['min'])!r}, {tuple(p['opt'])!r}, {tuple(p['max'])!r})"
        for name, p in recipe["profile"].items()
    ]
    flavor = features_of(label).flavor
    return BUILD_SCRIPT.format(
        label=label,
        module=flavor,
        model=MODEL,
        engine=ENGINE,
        cache=CACHE,
        rebuilt=REBUILT,
        cache_note="" if has_cache else " (an empty cache: none was kept with this trial)",
        configure="\n".join(f"    {line}" for line in body),
        profile="\n".join(f"    {line}" for line in profile),
        network_flags="1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)"
        if recipe.get("strongly_typed")
        else "0",
    )


def inference_flags(features: Features, cuda_graph: bool) -> list[str]:
    """trtexec's timing as the tuner timed: CUDA graph (or not), no transfers, spin-wait (11.x defaults; 10.x asks)."""
    if features.weak_typing:
        return [*(["--useCudaGraph"] if cuda_graph else []), "--noDataTransfers", "--useSpinWait"]
    return [] if cuda_graph else ["--noCudaGraph"]


def trtexec_line(recipe: Mapping[str, Any], label: str, has_cache: bool, cuda_graph: bool) -> list[str]:
    """The trtexec command (as arguments) that rebuilds the recorded build and times the result."""
    features = features_of(label)
    args = ["trtexec", f"--onnx={MODEL}", f"--saveEngine={REBUILT}", *shape_flags(recipe["profile"])]
    if features.weak_typing and recipe.get("strongly_typed"):
        args.append("--stronglyTyped")
    args += [flag for call in recipe["config"] for flag in trtexec_flags(call, features)]
    if has_cache:
        args.append(f"--timingCacheFile={CACHE}")
    return args + inference_flags(features, cuda_graph)


def _shell(args: list[str]) -> str:
    return " \\\n  ".join(shlex.quote(a) for a in args)


def deployment(request: ExportRequest) -> Deployment:
    """engine.plan, model.onnx, timing.cache, trtexec.sh and build_engine.py, from the trial's recorded build."""
    info = request.build_info
    label, recipe = str(info.get("trt", "")), info.get("builder")
    if not recipe:
        return Deployment(
            artifact_name=ENGINE,
            notes=[
                "This trial was built before the tuner recorded its builder calls: no trtexec line or build script. "
                "Rebuild the route with the tuner (reproduce.sh says how) to get them."
            ],
        )
    variant, kept = Path(str(recipe.get("variant_path", ""))), Path(str(recipe.get("timing_cache_file", "")))
    has_cache = kept.is_file()
    features = features_of(label)
    cuda_graph = bool(CUDA_GRAPH.get(request.model.options))
    line = trtexec_line(recipe, label, has_cache, cuda_graph)
    files: dict[str, str | bytes | Path] = {
        "trtexec.sh": f"#!/bin/sh\n# Rebuilds {ENGINE}'s route from {MODEL} with trtexec ({label}) and times the "
        "result.\n"
        f'set -eu\ncd "$(dirname "$0")"\n{_shell(line)}\n',
        "build_engine.py": build_script(recipe, label, has_cache),
    }
    if variant.is_file():
        files[MODEL] = variant
    if has_cache:
        files[CACHE] = kept
    notes = [
        f"Deploy {ENGINE} itself: TensorRT times tactics anew on every build, and may override a pinned GPT knob, "
        "so a rebuild can differ."
    ]
    if features.rtx:
        notes.append(
            "Built with TensorRT-RTX: trtexec.sh is written in enterprise TensorRT's trtexec spelling; "
            "TensorRT-RTX's own command-line tool was not checked against it. build_engine.py uses the tensorrt_rtx "
            "module."
        )
    if not variant.is_file():
        notes.append(
            f"The ONNX file the engine was built from ({variant.name}) is no longer in the work dir: trtexec.sh and "
            f"build_engine.py need it as {MODEL}."
        )
    run = [
        "trtexec",
        f"--loadEngine={ENGINE}",
        *shape_flags(recipe["profile"], ("run",)),
        *inference_flags(features, cuda_graph),
    ]
    return Deployment(
        artifact_name=ENGINE,
        files=files,
        executables=("trtexec.sh", "build_engine.py"),
        about={
            "trtexec.sh": "the trtexec line that rebuilds the engine: shapes, builder options, tactic sources, build "
            "route, timing cache",
            "build_engine.py": "the same build through the TensorRT Python API",
            MODEL: "the ONNX file (precision variant) the engine was built from",
            CACHE: "the timing cache the build left",
        },
        commands=[" ".join(shlex.quote(a) for a in run)],
        needs=f"TensorRT {features.version}'s trtexec on PATH (NVIDIA's TensorRT container or tarball; the pip wheels "
        f"have no trtexec); build_engine.py needs the `{features.flavor}` Python package of that version",
        run=f"`sh reproduce.sh` times {ENGINE} as it was measured; `sh trtexec.sh` rebuilds it with trtexec, "
        "`python3 build_engine.py` with the Python API.",
        notes=notes,
    )
