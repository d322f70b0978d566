"""Build an ONNX Runtime route: transformer fusions -> precision variant -> ORT-optimised ONNX file."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from tuner.backends.base import Artifact, BuildContext, BuildError
from tuner.backends.onnxruntime.space import FUSIONS
from tuner.measure.inputs import file_hash
from tuner.precision import VariantOptions, make_variant
from tuner.space import Route

LEVELS = {"disabled": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}
PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}


def build(route: Route, ctx: BuildContext) -> Artifact:
    """Write `engine.onnx` for `route` into `ctx.out_dir`."""
    import onnxruntime as ort

    t0 = time.perf_counter()
    source = ctx.model.path
    if route.get("transformer_fusion"):
        source = _fused(source, route, ctx)
    try:
        variant = make_variant(
            source,
            VariantOptions(str(route["precision"]), str(route.get("keep_fp32", "none")), bool(route.get("per_channel", True)), str(route.get("calibration", "minmax"))),
            ctx.calibration,
            ctx.work_dir / "variants",
        )
    except Exception as exc:  # quantizers raise many types; all mean "this variant cannot be made"
        raise BuildError(f"precision variant {route['precision']}: {type(exc).__name__}: {exc}") from exc
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    out = ctx.out_dir / "engine.onnx"
    opts = ort.SessionOptions()
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[str(route["graph_optimization_level"])])
    opts.optimized_model_filepath = str(out)
    opts.log_severity_level = 3
    try:
        ort.InferenceSession(str(variant), opts, providers=PROVIDERS[str(route["provider"])])
    except Exception as exc:  # onnxruntime raises its own Fail/NotImplemented/InvalidGraph types
        raise BuildError(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from exc
    if not out.exists():
        raise BuildError("ONNX Runtime wrote no optimised model")
    return Artifact(out, time.perf_counter() - t0, {"variant": variant.name})


def _fused(model: Path, route: Route, ctx: BuildContext) -> Path:
    """The model after ONNX Runtime's transformer optimizer with the route's fusion switches (cached)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    opts = ctx.model.options
    switches = {attr: bool(route.get(name, True)) for name, attr in FUSIONS.items()}
    key = hashlib.sha256(json.dumps({"m": file_hash(model), "s": switches, "o": dict(opts)}, sort_keys=True, default=str).encode()).hexdigest()[:24]
    cache = ctx.work_dir / "variants"
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"{model.stem}.fused.{key}.onnx"
    if out.exists():
        return out
    fusion = FusionOptions(str(opts["model_type"]))
    for attr, on in switches.items():
        setattr(fusion, attr, on)
    try:
        optimized = optimize_model(
            str(model), model_type=str(opts["model_type"]), num_heads=int(opts.get("num_heads", 0)),
            hidden_size=int(opts.get("hidden_size", 0)), optimization_options=fusion, opt_level=0,
        )
    except Exception as exc:
        raise BuildError(f"transformer optimizer: {type(exc).__name__}: {exc}") from exc
    fd, tmp = tempfile.mkstemp(prefix=f".{out.stem}.", suffix=".onnx", dir=cache)
    os.close(fd)
    try:
        optimized.save_model_to_file(tmp)
        Path(tmp).replace(out)
    finally:
        Path(tmp).unlink(missing_ok=True)
    ctx.log(f"transformer fusions: {optimized.get_fused_operator_statistics()}")
    return out
