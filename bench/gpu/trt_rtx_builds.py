"""Real TensorRT-RTX builds on a GPU, through the backend's own isolated trial children.

Run on the GPU machine after the TensorRT-RTX payload is unpacked (see docs/tensorrt-backend.md):

    PYTHONPATH=/tmp/trt-rtx/site:. LD_LIBRARY_PATH=/tmp/trt-rtx/lib:$LD_LIBRARY_PATH \\
        python3 bench/gpu/trt_rtx_builds.py --out bench/results/trt-rtx-builds.json

Needs only numpy, onnx, onnxruntime, torch, cuda-python, the RTX bindings and this repository (the
imports below pull no optuna/sqlalchemy). For each model (the bundled EfficientNet-Lite0, a small
transformer encoder exported here with torch.onnx.export, and the tests' Silero-VAD-shaped model with
a scalar int64 `sr` and a state batched on axis 1) and each route of a spread over the space,
it runs `tuner.worker.isolate.run_isolated` on a Job, exactly as a worker would, and records build
success, build time, engine size and the failure class (`runtime-unsupported` where TensorRT-RTX
refuses to run the engine on this GPU). It also checks, on the real module, every TensorRT name the
backend uses, and the CUDA plumbing (device buffers, stream capture into a CUDA graph, event timing).
The JSON is rewritten after every build, so a run cut short still leaves its results.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tools" / "trt_api")]

from tests.models import vad_model  # noqa: E402
from tuner import job as J  # noqa: E402
from tuner.backends.base import ModelInfo  # noqa: E402
from tuner.backends.tensorrt.gpu import gpu_fingerprint  # noqa: E402
from tuner.backends.tensorrt.probe import knob_database, probe  # noqa: E402
from tuner.backends.tensorrt.space import trt_space  # noqa: E402
from tuner.backends.tensorrt.version import load_trt  # noqa: E402
from tuner.measure.inputs import save_feeds  # noqa: E402
from tuner.measure.reference import compute_reference  # noqa: E402
from tuner.objective import ObjectiveSpec  # noqa: E402
from tuner.space import SearchSpace  # noqa: E402
from tuner.worker.isolate import run_isolated  # noqa: E402

VAD_SHAPES = {"input": (1, 512), "state": (2, 1, 128), "sr": ()}
VAD_CONSTANTS = {
    "sr": np.array(16000, np.int64),
    "state": np.zeros((2, 1, 128), np.float32),
}  # as a study's [data.inputs]

# Deviations from the default route; each is one build per model.
SPREAD: list[dict[str, Any]] = [
    {},
    {"precision": "fp16"},
    {"precision": "fp16", "keep_fp32": "none"},
    {"precision": "bf16"},
    {"precision": "int8_static"},
    {"precision": "fp8_static"},
    {"builder_optimization_level": 5},
    {"builder_optimization_level": 2},
    {"tiling_optimization_level": "FAST", "l2_limit_pct": 50},
    {"max_num_tactics": 16},
    {"max_aux_streams": 0},
    {"workspace_log2": 28},
    {"tf32": False},
    {"tactic_edge_mask": False, "tactic_jit": False},
    {"avg_timing_iterations": 1},
    {"sparse_weights": True},
]


# The VAD-shaped model only checks that scalar and non-first-batch inputs build: the default and fp16.
VAD_SPREAD: list[dict[str, Any]] = [{}, {"precision": "fp16"}]


def route_for(space: SearchSpace, changes: dict[str, Any]) -> dict[str, Any]:
    """The default route with `changes`, conditions applied in parameter order."""
    route: dict[str, Any] = {}
    for p in space.params:
        if p.active(route):
            route[p.name] = changes.get(p.name, p.default)
    return route


def transformer_onnx(path: Path) -> tuple[Path, dict[str, tuple[int, ...]]]:
    """A 2-layer transformer encoder (d_model 128, 4 heads) exported with the TorchScript exporter."""
    import torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256, batch_first=True, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    x = torch.randn(1, 32, 128)
    torch.onnx.export(model, (x,), str(path), input_names=["x"], output_names=["y"], opset_version=17, dynamo=False)
    return path, {"x": (1, 32, 128)}


def make_job(
    model: Path, shapes: dict[str, tuple[int, ...]], route: dict[str, Any], work: Path, feeds: Path, reference: Path
) -> J.Job:
    """A trial job as a worker would write it (timing settings minimal: runtime is refused on this GPU)."""
    return J.Job(
        backend="tensorrt",
        route=route,
        model_path=str(model),
        input_shapes={k: list(v) for k, v in shapes.items()},
        options={},
        work_dir=str(work),
        out_dir=str(work / "out"),
        feeds_path=str(feeds),
        reference_path=str(reference),
        metric="cosine",
        tolerance=0.01,
        atol=1e-3,
        rtol=1e-3,
        gate_samples=1,
        timeout_s=180.0,
        objective=ObjectiveSpec(warmup_s=0.05, min_repeats=5, min_duration_s=0.05),
    )


def check_names() -> dict[str, Any]:
    """Resolve every name the backend uses (except 10.x-only ones) on the real module."""
    from used_names import TRT10_ONLY, used_names

    trt = load_trt().trt
    missing = []
    for name in sorted(used_names() - TRT10_ONLY):
        obj: Any = trt
        for part in name.split("."):
            if not hasattr(obj, part):
                missing.append(name)
                break
            obj = getattr(obj, part)
    return {"checked": len(used_names() - TRT10_ONLY), "missing": missing}


def check_cuda() -> dict[str, Any]:
    """Device buffers round trip, a CUDA graph of one async copy, and CUDA-event timing of its launch."""
    from tuner.backends.tensorrt.cuda import DeviceArray, Graph, call, cudart
    from tuner.measure.gpu_timing import CudaEventTimer

    host = np.arange(1 << 20, dtype=np.float32)
    src, dst = DeviceArray(host.shape, host.dtype), DeviceArray(host.shape, host.dtype)
    timer = CudaEventTimer()
    try:
        src.upload(host)
        rt = cudart()

        def copy(stream: int) -> Any:
            return call(
                rt.cudaMemcpyAsync(dst.ptr, src.ptr, src.nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice, stream),
                "cudaMemcpyAsync",
            )

        graph = Graph(timer.stream, copy)
        seconds = [timer.time(graph.launch) for _ in range(5)]
        graph.destroy()
        return {
            "round_trip_equal": bool(np.array_equal(dst.download(), host)),
            "graph_launch_ms": [round(s * 1e3, 4) for s in seconds],
            "timer_info": timer.info(),
        }
    finally:
        src.free()
        dst.free()
        timer.close()


def machine_state() -> dict[str, Any]:
    """Load and the versions the variants depend on (ONNX Runtime's converters make them)."""
    import onnx
    import onnxruntime
    import torch

    return {
        "loadavg": os.getloadavg(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "onnxruntime": onnxruntime.__version__,
        "onnx": onnx.__version__,
        "torch": torch.__version__,
    }


def main(argv: list[str]) -> int:
    """Build the spread for both models and write the JSON report."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/trt-rtx-bench"))
    ap.add_argument("--budget-s", type=float, default=330.0, help="stop starting builds after this many seconds")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    api = load_trt()
    report: dict[str, Any] = {
        "trt": api.label,
        "gpu": gpu_fingerprint(),
        "machine": machine_state(),
        "names": check_names(),
    }
    report["probe"] = {k: v for k, v in probe(runtime=True).items() if k != "all_build_routes"}
    report["probe"]["all_build_routes_chars"] = len(probe()["all_build_routes"])
    report["cuda_plumbing"] = check_cuda()
    report["builds"] = []
    args.work.mkdir(parents=True, exist_ok=True)
    models = [(REPO / "models" / "efficientnet_lite0.onnx", {"images": (1, 3, 224, 224)}, SPREAD, {})]
    models.append((*transformer_onnx(args.work / "encoder2.onnx"), SPREAD, {}))
    models.append((vad_model(args.work / "vad.onnx"), VAD_SHAPES, VAD_SPREAD, VAD_CONSTANTS))
    rng = np.random.default_rng(0)
    for model, shapes, spread, constants in models:
        work = args.work / model.stem
        work.mkdir(parents=True, exist_ok=True)
        feeds = [
            {
                k: constants[k] if k in constants else rng.standard_normal(v).astype(np.float32)
                for k, v in shapes.items()
            }
            for _ in range(2)
        ]
        save_feeds(work / "feeds.npz", feeds)
        save_feeds(work / "reference.npz", compute_reference(model, feeds))
        space = trt_space(api.features, ModelInfo(model, shapes), knob_database(api))
        for i, changes in enumerate(spread):
            if time.monotonic() - t_start > args.budget_s:
                report["builds"].append(
                    {"model": model.name, "route_changes": changes, "status": "skipped (bench time budget)"}
                )
                continue
            route = route_for(space, changes)
            res = run_isolated(
                make_job(model, shapes, route, work / f"r{i:02d}", work / "feeds.npz", work / "reference.npz"),
                work / f"r{i:02d}",
            )
            report["builds"].append(
                {
                    "model": model.name,
                    "route_changes": changes,
                    "status": res.status,
                    "phase": res.phase,
                    "built": res.artifact_bytes is not None,
                    "build_s": res.build_s,
                    "engine_bytes": res.artifact_bytes,
                    "message": res.message[:400],
                }
            )
            print(f"{model.name} {changes}: {res.status} build_s={res.build_s} bytes={res.artifact_bytes}", flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=1, default=str))
    report["wall_s"] = round(time.monotonic() - t_start, 1)
    args.out.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
