"""Build an Inductor route: source module -> device/precision/layout -> torch.compile -> warm-up compile.

The source is the study's ONNX model converted by onnx2torch, or the module that
backend.options.module = "pkg.mod:fn" returns (fn() -> (torch.nn.Module, example inputs)).

The artifact is `inductor.tar`: the output code Inductor generated for the route (one Python module
per compiled graph, holding the wrapper that launches the kernels and every Triton/C++ kernel's
source inline, captured through Inductor's `GraphLowering.save_output_code` hook) and
`manifest.json` (route, compile options, device, graph count, code hash). That code *is* the
engine: equal code gives an equal hash, and a reviewer reads in it what a route changed (fusions, GEMM templates,
CUDA-graph wrapping). Compiled binaries stay in Inductor's cache, shared by the study's trials on this machine
(`$TORCHINDUCTOR_CACHE_DIR` if set, else `<work_dir>/inductor-cache`), so a route compiled before is
a cache hit; loading an artifact in another process recompiles its route from that cache
and checks that the code is the same. The tar is written deterministically (fixed order, zeroed metadata).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import json
import os
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tuner.backends.base import Artifact, BuildContext, BuildError, Feed, ModelInfo
from tuner.backends.inductor.engine import Engine
from tuner.backends.inductor.space import MODULE, compile_options, resolve_device
from tuner.errors import first_line
from tuner.files import atomic_path
from tuner.space import Route

ARTIFACT = "inductor.tar"
WARMUP_CALLS = 3  # CUDA-graph modes record on the third call; every compile happens before timing
ONNX_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}  # torch -> ONNX Pad mode


def build(route: Route, ctx: BuildContext) -> Artifact:
    """Compile `route`, warm it up, and write its generated code to `ctx.out_dir/inductor.tar`."""
    t0 = time.perf_counter()
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    engine, codes, timings = compile_engine(route, ctx.model, ctx.calibration[0], ctx.work_dir)
    manifest = {
        "route": dict(route),
        "options": engine.options,
        "device": engine.device_name,
        "graphs": len(codes),
        "code_sha256": code_digest(codes),
    }
    ctx.log(
        f"inductor: source in {timings['source_s']:.2f} s, compiled and warmed up in {timings['compile_s']:.2f} s, "
        f"{len(codes)} graph(s), cache hits {timings['cache_hits']}"
    )
    path = ctx.out_dir / ARTIFACT
    pack(codes, manifest, path)
    return Artifact(path, time.perf_counter() - t0, {**manifest, **timings}, handle=engine)


def rebuild(
    artifact_path: Path, route: Route, model: ModelInfo, feed: Feed, work_dir: Path, log: Callable[[str], None]
) -> Engine:
    """An engine for a stored artifact: recompile its route (from the shared cache) and compare the code."""
    engine, codes, _ = compile_engine(route, model, feed, work_dir)
    with tarfile.open(artifact_path) as tar:
        member = tar.extractfile("manifest.json")
        stored = json.loads(member.read()) if member else {}
    if stored.get("code_sha256") != code_digest(codes):
        log(
            "inductor: the route recompiled to different code than the stored artifact (e.g. autotuning chose other "
            "kernels)"
        )
    return engine


def cache_dir(work_dir: Path) -> Path:
    """Inductor's cache for this process: $TORCHINDUCTOR_CACHE_DIR if set, else `<work_dir>/inductor-cache`."""
    path = Path(os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(work_dir / "inductor-cache")))
    path.mkdir(parents=True, exist_ok=True)
    return path


def compile_engine(
    route: Route, model: ModelInfo, feed: Feed, work_dir: Path
) -> tuple[Engine, list[str], dict[str, Any]]:
    """The compiled, warmed-up engine for `route`, the output code of its graphs, and timings."""
    import torch
    from torch._dynamo.utils import counters

    options = compile_options(route, model.options)
    device = resolve_device(model.options)
    if device == "cuda" and not torch.cuda.is_available():
        raise BuildError("backend.options.device = 'cuda' but torch sees no CUDA device")
    cache_dir(work_dir)
    t0 = time.perf_counter()
    module, output_names = load_source(model, feed)
    source_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    hits = _cache_hits(counters)
    engine = Engine.create(module, route, device, list(model.input_shapes), output_names, options)
    codes: list[str] = []
    try:
        with capture_output_code(codes.append):
            args = engine.inputs(feed)
            for _ in range(WARMUP_CALLS):
                engine.forward(args)
            engine.synchronize()
    except Exception as exc:  # Dynamo/Inductor raise many types (BackendCompilerFailed, Unsupported, ...)
        raise BuildError(f"torch.compile: {type(exc).__name__}: {first_line(exc)[:400]}") from exc
    if not codes:
        raise BuildError("Inductor generated no code for this model (it ran eagerly)")
    timings = {
        "source_s": round(source_s, 4),
        "compile_s": round(time.perf_counter() - t1, 4),
        "cache_hits": _cache_hits(counters) - hits,
    }
    return engine, codes, timings


@contextlib.contextmanager
def capture_output_code(sink: Callable[[str], None]) -> Iterator[None]:
    """Hand every wrapper module Inductor generates to `sink` while the block runs.

    Inductor's own hook for this is the class attribute `GraphLowering.save_output_code` (None by
    default; called with each graph's output code when it is compiled). The previous value is put
    back when the block ends, also on error.
    """
    from torch._inductor.graph import GraphLowering

    previous = GraphLowering.save_output_code
    GraphLowering.save_output_code = sink
    try:
        yield
    finally:
        GraphLowering.save_output_code = previous


def load_source(model: ModelInfo, feed: Feed) -> tuple[Any, list[str]]:
    """The eager torch module for the study (onnx2torch or backend.options.module) and the output names."""
    output_names = _onnx_outputs(model.path)
    target = MODULE.get(model.options)
    if target:
        return _from_function(str(target), model), output_names
    try:
        from onnx2torch import convert
    except ImportError as exc:
        raise BuildError(
            f"onnx2torch is not installed ({exc}); pip install 'route-tuner[inductor]' or set backend.options.module"
        ) from exc
    try:
        module = convert(str(model.path)).eval()
    except (
        Exception
    ) as exc:  # onnx2torch signals unsupported ops with several exception types (NotImplementedError, KeyError)
        raise BuildError(f"onnx2torch: {type(exc).__name__}: {first_line(exc)[:400]}") from exc
    return static_shapes(module, [feed[name] for name in model.input_shapes]), output_names


def static_shapes(module: Any, example: list[Any]) -> Any:
    """Specialise onnx2torch's shape-taking modules to the study's fixed input shapes.

    onnx2torch passes a Reshape's target shape and a Pad's pads as tensors: Dynamo cannot trace
    `torch.Size(tensor)` (an internal error) and breaks the graph at every `pads.tolist()`. A
    study's input shapes are fixed, so one eager run through `torch.fx.Interpreter` records each
    one's concrete arguments and output: a Reshape becomes `torch.reshape` to its output shape, a
    Pad becomes onnx2torch's own static Pad module with the recorded pads.
    """
    import torch
    from onnx2torch.node_converters.pad import OnnxPadDynamic, OnnxPadStatic
    from onnx2torch.node_converters.reshape import OnnxReshape
    from torch.fx import Interpreter

    kinds = (OnnxReshape, OnnxPadDynamic)
    targets = {
        n for n in module.graph.nodes if n.op == "call_module" and isinstance(module.get_submodule(n.target), kinds)
    }
    seen: dict[Any, tuple[tuple[Any, ...], Any]] = {}

    class Recorder(Interpreter):
        def run_node(self, n: Any) -> Any:
            out = super().run_node(n)
            if n in targets:
                seen[n] = (self.fetch_args_kwargs_from_env(n)[0], out)
            return out

    if targets:
        with torch.no_grad():
            Recorder(module).run(*(torch.from_numpy(a) for a in example))
    for n, (args, out) in seen.items():
        sub = module.get_submodule(n.target)
        if isinstance(sub, OnnxReshape):
            with module.graph.inserting_before(n):
                n.replace_all_uses_with(module.graph.call_function(torch.reshape, (n.args[0], tuple(out.shape))))
            module.graph.erase_node(n)
        else:
            value = float(args[2]) if len(args) > 2 and args[2] is not None else 0.0
            module.add_submodule(
                n.target,
                OnnxPadStatic.create_from_onnx_params(
                    onnx_pads=args[1].tolist(), onnx_mode=ONNX_PAD_MODES[sub.mode], constant_value=value
                ),
            )
            n.args = (n.args[0],)
    module.graph.eliminate_dead_code()
    module.delete_all_unused_submodules()
    module.recompile()
    return module


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
        raise BuildError(
            f"{target}: example inputs have shapes {shapes}; the study's inputs are {list(model.input_shapes.values())}"
        )
    return module.eval()


def _onnx_outputs(path: Path) -> list[str]:
    import onnx

    return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]


def code_digest(codes: list[str]) -> str:
    """sha256 over the output code of every graph, in compile order."""
    h = hashlib.sha256()
    for code in codes:
        h.update(code.encode())
        h.update(b"\0")
    return h.hexdigest()


def pack(codes: list[str], manifest: dict[str, Any], out: Path) -> None:
    """Write the manifest and one `graph_NNN.py` per output code into the tar `out`, deterministically."""
    files = {"manifest.json": json.dumps(manifest, sort_keys=True, indent=1, default=str).encode()}
    files.update({f"graph_{i:03d}.py": code.encode() for i, code in enumerate(codes)})
    with atomic_path(out) as tmp, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))


def _cache_hits(counters: Any) -> int:
    """Graphs served from Inductor's caches so far: AOTAutograd-cache hits plus FX-graph-cache hits."""
    return int(counters["aot_autograd"]["autograd_cache_hit"] + counters["inductor"]["fxgraph_cache_hit"])
