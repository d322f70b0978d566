"""Build a TensorRT route: precision variant -> parsed network -> configured builder -> engine file.

Runs in the trial's child process. `configure` (route -> IBuilderConfig calls) and the GPT route are
kept apart from the native calls so they can be tested against a recording stand-in config.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner import job as J
from tuner.backends.base import Artifact, BuildContext, BuildError
from tuner.backends.tensorrt.cuda import DeviceFacts
from tuner.backends.tensorrt.gpt import apply_route, compose_route, parse_knob_database
from tuner.backends.tensorrt.options import TIMING_CACHE, TIMING_CACHE_POLICIES
from tuner.backends.tensorrt.recipe import Call, RecordingConfig
from tuner.backends.tensorrt.space import LEGACY_TACTICS, TACTICS, UNSET
from tuner.backends.tensorrt.version import Features, TrtApi
from tuner.files import atomic_write
from tuner.precision import VariantOptions, make_variant
from tuner.space import Route


class BuildTimeout(BuildError):
    """The progress monitor cancelled the build at the trial's deadline."""

    failure_class = J.TIMEOUT


def network_flags(trt: Any, features: Features, route: Route) -> int:
    """`create_network` flags: 10.x builds strongly typed unless weak-typing flags are chosen."""
    if features.weak_typing and route.get("builder_precision", "none") == "none":
        return 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    return 0  # 11.x and TensorRT-RTX are always strongly typed


def configure(trt: Any, features: Features, config: Any, route: Route, device: DeviceFacts) -> None:
    """Apply the route's builder knobs to `config` (an IBuilderConfig)."""
    config.builder_optimization_level = int(route["builder_optimization_level"])
    if features.tiling:
        level = str(route["tiling_optimization_level"])
        config.tiling_optimization_level = getattr(trt.TilingOptimizationLevel, level)
        pct = int(route.get("l2_limit_pct", UNSET))
        if level != "NONE" and pct != UNSET:
            config.l2_limit_for_tiling = device.l2_bytes * pct // 100
    if features.max_num_tactics:
        config.max_num_tactics = int(route["max_num_tactics"])
    if int(route["max_aux_streams"]) != UNSET:
        config.max_aux_streams = int(route["max_aux_streams"])
    if int(route["workspace_log2"]) != UNSET:
        config.set_memory_pool_limit(
            trt.MemoryPoolType.WORKSPACE, min(1 << int(route["workspace_log2"]), device.free_bytes)
        )
    _flag(config, trt.BuilderFlag.TF32, bool(route["tf32"]))
    _flag(config, trt.BuilderFlag.SPARSE_WEIGHTS, bool(route["sparse_weights"]))
    config.avg_timing_iterations = int(route["avg_timing_iterations"])
    names = {**TACTICS, **(LEGACY_TACTICS if features.legacy_tactics else {})}
    mask = sum(1 << int(getattr(trt.TacticSource, source)) for param, source in names.items() if route.get(param))
    if not config.set_tactic_sources(mask):
        raise BuildError(f"TensorRT refused the tactic sources {[s for p, s in names.items() if route.get(p)]}")
    if features.weak_typing:
        _weak_precision(trt, config, route)


def _flag(config: Any, flag: Any, on: bool) -> None:
    if on:
        config.set_flag(flag)
    else:
        config.clear_flag(flag)


def _weak_precision(trt: Any, config: Any, route: Route) -> None:
    """10.x weak typing: FP16/BF16 (optionally obeyed) flags; INT8/FP8 for a quantized variant."""
    mode = str(route.get("builder_precision", "none"))
    if mode == "none":
        return
    config.set_flag(trt.BuilderFlag.BF16 if mode == "bf16" else trt.BuilderFlag.FP16)
    if mode == "fp16_obey":
        config.set_flag(trt.BuilderFlag.OBEY_PRECISION_CONSTRAINTS)
    if route["precision"] == "int8_static":
        config.set_flag(trt.BuilderFlag.INT8)
    elif route["precision"] == "fp8_static":
        config.set_flag(trt.BuilderFlag.FP8)


def gpt_route(features: Features, config: Any, route: Route) -> str | None:
    """Compose the route's GPT knobs from this config's knob database, set it and verify it."""
    if not features.gpt_api:
        return None
    db = parse_knob_database(str(config.all_build_routes))
    if not db.knobs:
        return None
    route_string = compose_route(db, route)
    apply_route(config, route_string)
    return route_string


def configure_recorded(
    trt: Any, features: Features, config: Any, route: Route, device: DeviceFacts
) -> tuple[str | None, list[Call]]:
    """`configure` and `gpt_route` on `config`, recorded (`recipe.RecordingConfig`): the route string and the calls
    made."""
    recording = RecordingConfig(config, trt)
    configure(trt, features, recording, route, device)
    return gpt_route(features, recording, route), recording.calls


def make_logger(trt: Any) -> Any:
    """An ILogger keeping warnings and errors (they explain a failed parse or build)."""

    class Logger(trt.ILogger):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.messages: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if int(severity) <= int(trt.ILogger.Severity.WARNING):
                self.messages.append(f"{str(severity).rsplit('.', 1)[-1]}: {msg}")

    return Logger()


def logged_errors(logger: Any) -> str:
    """The errors a `make_logger` logger kept, joined (the tail, if long)."""
    return " | ".join(m for m in logger.messages if not m.startswith("WARNING"))[-2000:]


def make_monitor(trt: Any, deadline_s: float | None) -> Any:
    """An IProgressMonitor that cancels the build once `deadline_s` (time.monotonic) has passed."""

    class DeadlineMonitor(trt.IProgressMonitor):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self.cancelled = False

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            pass

        def step_complete(self, phase_name: str, step: int) -> bool:
            self.cancelled = self.cancelled or (deadline_s is not None and time.monotonic() >= deadline_s)
            return not self.cancelled

        def phase_finish(self, phase_name: str) -> None:
            pass

    return DeadlineMonitor()


def parse(trt: Any, network: Any, path: Path, logger: Any) -> None:
    """Parse the ONNX file into `network`; BuildError listing every parser error."""
    parser = trt.OnnxParser(network, logger)
    if parser.parse_from_file(str(path)):
        return
    errors = [_describe(parser.get_error(i)) for i in range(parser.num_errors)]
    raise BuildError(f"ONNX parser: {len(errors)} error(s): " + "; ".join(errors))


def _describe(error: Any) -> str:
    return f"{error.node_name() or '?'} ({error.node_operator() or '?'}): {error.desc()}"


def add_profile(
    builder: Any, network: Any, config: Any, served: list[tuple[Mapping[str, tuple[int, ...]], float]]
) -> dict[str, dict[str, Any]]:
    """One optimization profile covering every shape served (`ModelInfo.served`); what it set, per input.

    Per input, min and max are the smallest and largest size of each dimension over the shapes, and opt is
    the heaviest-weighted shape: TensorRT picks its tactics for opt, and the weighted mix spends most of
    its time there. With one shape min = opt = max. Each input's record has its `min`, `opt` and `max`
    shapes and whether the network left a dimension of it dynamic (only those are named to trtexec, which
    refuses shapes for a static network).
    """
    profile = builder.create_optimization_profile()
    record: dict[str, dict[str, Any]] = {}
    top = max(range(len(served)), key=lambda i: (served[i][1], -i))
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        shapes = [tuple(inputs.get(tensor.name, tuple(tensor.shape))) for inputs, _ in served]
        if any(d < 0 for shape in shapes for d in shape):
            raise BuildError(f"input {tensor.name} has dynamic shape {shapes[0]}; give its shape in [model] inputs")
        low = tuple(min(dims) for dims in zip(*shapes))
        high = tuple(max(dims) for dims in zip(*shapes))
        profile.set_shape(tensor.name, low, shapes[top], high)
        record[tensor.name] = {
            "min": list(low),
            "opt": list(shapes[top]),
            "max": list(high),
            "dynamic": any(d < 0 for d in tensor.shape),
        }
    config.add_optimization_profile(profile)
    return record


class TimingCache:
    """The timing-cache policy: 'fresh' (an empty cache per build: trials stay independent) or
    'shared' (one cache file per TensorRT version and GPU in the study's work dir, reused and updated)."""

    def __init__(self, policy: str, work_dir: Path, key: str) -> None:
        if policy not in TIMING_CACHE_POLICIES:
            raise BuildError(f"backend.options.timing_cache: expected one of {TIMING_CACHE_POLICIES}, got {policy!r}")
        self.policy = policy
        self.path = work_dir / "timing-cache" / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', key)}.cache"

    def attach(self, config: Any) -> None:
        """Give the config its starting cache."""
        data = self.path.read_bytes() if self.policy == "shared" and self.path.exists() else b""
        cache = config.create_timing_cache(data)
        if not config.set_timing_cache(cache, False):
            raise BuildError("TensorRT refused the timing cache")

    def save(self, config: Any, engine_sha256: str) -> Path:
        """Keep the cache as this build left it, by the engine's hash (what an export ships as timing.cache); the
        shared policy also writes it back (atomic, the last writer wins). Returns where the engine's copy is."""
        data = bytes(memoryview(config.get_timing_cache().serialize()))
        if self.policy == "shared":
            atomic_write(self.path, data)
        kept = self.path.parent / "engines" / f"{engine_sha256}.cache"
        atomic_write(kept, data)
        return kept


def build(api: TrtApi, route: Route, ctx: BuildContext, device: DeviceFacts) -> Artifact:
    """Build `route` into `ctx.out_dir/engine.plan`."""
    trt, features = api.trt, api.features
    t0 = time.perf_counter()
    try:
        variant = make_variant(
            ctx.model.path,
            VariantOptions(str(route["precision"]), str(route.get("keep_fp32", "none")), tensorrt_qdq=True),
            ctx.calibration,
            ctx.work_dir / "variants",
        )
    except Exception as exc:  # quantizers and converters raise many types; all mean "no such variant"
        raise BuildError(f"precision variant {route['precision']}: {type(exc).__name__}: {exc}") from exc
    logger = make_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(network_flags(trt, features, route))
    parse(trt, network, variant, logger)
    config = builder.create_builder_config()
    route_string, calls = configure_recorded(trt, features, config, route, device)
    profile = add_profile(builder, network, config, ctx.model.served())
    timing_cache = TimingCache(str(TIMING_CACHE.get(ctx.model.options)), ctx.work_dir, api.label)
    timing_cache.attach(config)
    monitor = make_monitor(trt, ctx.deadline_s)
    config.progress_monitor = monitor
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        if monitor.cancelled:
            raise BuildTimeout("build cancelled by the progress monitor: the trial's deadline passed")
        raise BuildError(f"build_serialized_network returned None: {logged_errors(logger) or 'no error logged'}")
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    out = ctx.out_dir / "engine.plan"
    data = bytes(memoryview(serialized))
    sha = hashlib.sha256(data).hexdigest()
    kept_cache = timing_cache.save(config, sha)
    out.write_bytes(data)
    flags = network_flags(trt, features, route)
    return Artifact(
        out,
        time.perf_counter() - t0,
        {
            "sha256": sha,
            "variant": variant.name,
            "trt": api.label,
            "timing_cache": timing_cache.policy,
            "build_route": route_string,
            "network_flags": flags,
            "builder": {
                "config": calls,
                "profile": profile,
                "strongly_typed": bool(flags),
                "variant_path": str(variant),
                "timing_cache_file": str(kept_cache),
            },
        },
    )
