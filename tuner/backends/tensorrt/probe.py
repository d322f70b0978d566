"""What this machine's TensorRT can do, found out in a child process (the worker never loads CUDA).

`python -m tuner.backends.tensorrt.probe [--runtime]` prints one JSON object: the module and version,
the GPT knob database (`all_build_routes`, empty when unavailable) and, with --runtime, whether a
tiny engine built here also deserializes here (TensorRT-RTX refuses compute capability 9.0).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from tuner.backends.tensorrt.gpt import EMPTY, KnobDatabase, parse_knob_database
from tuner.backends.tensorrt.version import TrtApi, load_trt
from tuner.errors import TunerError


def probe(runtime: bool = False, timeout_s: float = 300.0) -> dict[str, Any]:
    """Run the probe in a child process and return its report."""
    cmd = [sys.executable, "-m", "tuner.backends.tensorrt.probe", *(["--runtime"] if runtime else [])]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise TunerError(f"the TensorRT probe did not finish in {timeout_s:g} s") from exc
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise TunerError(f"the TensorRT probe failed: {tail[0]}")
    return json.loads(lines[-1])


@cache
def knob_database(api: TrtApi) -> KnobDatabase:
    """This machine's GPT knob database (EMPTY where the version has no GPT API)."""
    if not api.features.gpt_api:
        return EMPTY
    return parse_knob_database(probe()["all_build_routes"])


def _tiny_onnx(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _runtime_check(api: TrtApi) -> dict[str, Any]:
    """Build a one-Relu engine and try to deserialize it here."""
    from tuner.backends.tensorrt.build import logged_errors, make_logger, parse

    trt = api.trt
    logger = make_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    with tempfile.TemporaryDirectory() as tmp:
        parse(trt, network, _tiny_onnx(Path(tmp) / "probe.onnx"), logger)
    config = builder.create_builder_config()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        return {
            "builds": False,
            "runs": False,
            "reason": logged_errors(logger) or "build_serialized_network returned None",
        }
    runtime = trt.Runtime(logger)
    try:
        engine = runtime.deserialize_cuda_engine(bytes(memoryview(serialized)))
    except Exception as exc:  # a refusal may raise instead of returning None
        return {"builds": True, "runs": False, "reason": f"{type(exc).__name__}: {exc}"}
    if engine is None:
        return {
            "builds": True,
            "runs": False,
            "reason": logged_errors(logger) or "deserialize_cuda_engine returned None",
        }
    return {"builds": True, "runs": True, "reason": ""}


def report(runtime: bool) -> dict[str, Any]:
    """The probe's findings, in this process."""
    from tuner.backends.tensorrt.build import make_logger

    api = load_trt()
    trt = api.trt
    out: dict[str, Any] = {"flavor": api.features.flavor, "version": api.features.version, "all_build_routes": ""}
    out["build_route_api"] = hasattr(trt.IBuilderConfig, "all_build_routes")
    if out["build_route_api"]:
        builder = trt.Builder(make_logger(trt))
        config = builder.create_builder_config()
        out["all_build_routes"] = str(config.all_build_routes)
    if runtime:
        out["runtime"] = _runtime_check(api)
    return out


def main(argv: list[str]) -> int:
    """Print the report as one JSON line."""
    try:
        print(json.dumps(report("--runtime" in argv)))
    except TunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
