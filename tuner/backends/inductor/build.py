"""Build an Inductor route: source module -> device/precision/layout -> torch.compile -> warm-up compile.

The source is the study's ONNX model converted by onnx2torch, or the module that
backend.options.module = "pkg.mod:fn" returns (fn() -> (torch.nn.Module, example inputs)).

The artifact is `inductor.tar`: the trial's own Inductor cache directory after the warm-up compile
(the generated Python wrapper code, the Triton/C++ kernels and their compiled binaries, autotuning
results and the FX-graph cache entry), plus `manifest.json` with the route and compile options. It
is the engine in the sense that matters here: loading it into a fresh process recompiles the same
route from that cache (an FX-graph cache hit: no kernel compilation, no autotuning), and the
generated code in it is what a reviewer reads to see what the route changed. The tar is written
deterministically (sorted names, zeroed times and owners) so equal contents hash equally.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import tarfile
import time
from pathlib import Path
from typing import Any

from tuner.backends.base import Artifact, BuildContext, BuildError, Feed, ModelInfo
from tuner.backends.inductor.run import Engine
from tuner.backends.inductor.space import compile_options, resolve_device
from tuner.space import Route

ARTIFACT = "inductor.tar"
CACHE_DIR = "inductor-cache"
WARMUP_CALLS = 3  # CUDA-graph modes record on the third call; every compile happens before timing
BUILT: dict[str, Engine] = {}  # engines built in this process, by artifact path, for `load`


def build(route: Route, ctx: BuildContext) -> Artifact:
    """Compile `route`, warm it up, and pack the Inductor cache it produced into `ctx.out_dir/inductor.tar`."""
    t0 = time.perf_counter()
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    cache = ctx.out_dir / CACHE_DIR
    engine, timings = compile_engine(route, ctx.model, ctx.calibration[0], cache)
    manifest = {"route": dict(route), "options": engine.options, "device": engine.device_name, **timings}
    ctx.log(f"inductor: converted in {timings['source_s']:.2f} s, compiled and warmed up in {timings['compile_s']:.2f} s")
    path = ctx.out_dir / ARTIFACT
    pack(cache, manifest, path)
    BUILT[str(path)] = engine
    return Artifact(path, time.perf_counter() - t0, manifest)


def restore(artifact_path: Path, route: Route, model: ModelInfo, feed: Feed, work_dir: Path) -> Engine:
    """An engine for a stored artifact: unpack its Inductor cache and compile the route from it."""
    cache = work_dir / f"restored-{artifact_path.stem}-{os.getpid()}"
    with tarfile.open(artifact_path) as tar:
        tar.extractall(cache, filter="data")
    engine, _ = compile_engine(route, model, feed, cache / CACHE_DIR)
    return engine


def compile_engine(route: Route, model: ModelInfo, feed: Feed, cache: Path) -> tuple[Engine, dict[str, float]]:
    """The compiled, warmed-up engine for `route`, with Inductor's cache in `cache`."""
    import torch

    options = compile_options(route, model.options)
    device = resolve_device(model.options)
    if device == "cuda" and not torch.cuda.is_available():
        raise BuildError("backend.options.device = 'cuda' but torch sees no CUDA device")
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)  # read by Inductor at each use; the child is ours alone
    t0 = time.perf_counter()
    module, output_names = load_source(model)
    source_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    engine = Engine.create(module, route, device, list(model.input_shapes), output_names, options)
    args = engine.inputs(feed)
    try:
        for _ in range(WARMUP_CALLS):
            engine.forward(args)
        engine.synchronize()
    except Exception as exc:  # Dynamo/Inductor raise many types (BackendCompilerFailed, Unsupported, ...)
        raise BuildError(f"torch.compile: {type(exc).__name__}: {_first_line(exc)}") from exc
    return engine, {"source_s": round(source_s, 4), "compile_s": round(time.perf_counter() - t1, 4)}


def load_source(model: ModelInfo) -> tuple[Any, list[str]]:
    """The eager torch module for the study (onnx2torch or backend.options.module) and the output names."""
    output_names = _onnx_outputs(model.path)
    target = model.options.get("module")
    if target:
        return _from_function(str(target), model), output_names
    try:
        from onnx2torch import convert
    except ImportError as exc:
        raise BuildError(f"onnx2torch is not installed ({exc}); pip install 'route-tuner[inductor]' or set backend.options.module") from exc
    try:
        return convert(str(model.path)).eval(), output_names
    except Exception as exc:  # onnx2torch raises NotImplementedError for unsupported ops, KeyError, ...
        raise BuildError(f"onnx2torch: {type(exc).__name__}: {_first_line(exc)}") from exc


def _from_function(target: str, model: ModelInfo) -> Any:
    """Call "pkg.mod:fn"; fn() returns (torch.nn.Module, example inputs in the ONNX model's input order)."""
    import torch

    module_name, _, attr = target.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise BuildError(f"backend.options.module = {target!r} cannot be loaded: {exc}") from exc
    result = fn()
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module)):
        raise BuildError(f"{target} must return (torch.nn.Module, example inputs)")
    module, examples = result
    examples = examples if isinstance(examples, tuple | list) else (examples,)
    shapes = [tuple(t.shape) for t in examples]
    if shapes != [tuple(s) for s in model.input_shapes.values()]:
        raise BuildError(f"{target}: example inputs have shapes {shapes}; the study's inputs are {list(model.input_shapes.values())}")
    return module.eval()


def _onnx_outputs(path: Path) -> list[str]:
    import onnx

    return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]


def pack(cache: Path, manifest: dict[str, Any], out: Path) -> None:
    """Write `cache` and `manifest` into the tar `out`, deterministically (sorted, zeroed metadata)."""

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
        return info

    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        data = json.dumps(manifest, sort_keys=True, indent=1, default=str).encode()
        info = clean(tarfile.TarInfo("manifest.json"))
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for path in sorted(p for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".lock")):
            tar.add(path, arcname=f"{CACHE_DIR}/{path.relative_to(cache)}", recursive=False, filter=clean)
    tmp.replace(out)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:400] if text else ""
