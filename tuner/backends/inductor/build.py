"""Build an Inductor route: source module -> device/precision/layout -> torch.compile -> warm-up compile.

The source is the study's ONNX model converted by onnx2torch, or the module that
backend.options.module = "pkg.mod:fn" returns (fn() -> (torch.nn.Module, example inputs)). The
engine serves every shape of `ModelInfo.served` (`[[objective.shapes]]`, else the study's input
shapes) with one module compiled and warmed up for each (`Engine`).

The artifact is `inductor.tar`: the output code Inductor generated for the route (one Python module
per compiled graph, holding the wrapper that launches the kernels and every Triton/C++ kernel's
source inline, captured through Inductor's `GraphLowering.save_output_code` hook) and
`manifest.json` (route, compile options, device, graph count, code hash, and with several shapes
each one's inputs and graph count, its graphs following the previous shape's). That code *is* the
engine: equal code gives an equal hash, and a reviewer reads in it what a route changed (fusions, GEMM templates,
CUDA-graph wrapping). Compiled binaries stay in Inductor's cache, shared by the study's trials on this machine
(`$TORCHINDUCTOR_CACHE_DIR` if set, else `<work_dir>/inductor-cache`), so a route compiled before is
a cache hit; loading an artifact in another process recompiles its route from that cache
and checks that the code is the same. The tar is written deterministically (fixed order, zeroed metadata).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib
import io
import json
import os
import re
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tuner.backends.base import Artifact, BuildContext, BuildError, Feed, ModelInfo
from tuner.backends.inductor.engine import Engine, shapes_of
from tuner.backends.inductor.space import MODULE, compile_options, resolve_device
from tuner.errors import first_line
from tuner.files import atomic_path
from tuner.space import Route

ARTIFACT = "inductor.tar"
WARMUP_CALLS = 3  # CUDA-graph modes record on the third call; every compile happens before timing
ONNX_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}  # torch -> ONNX Pad mode
AOT_ID_LINE = re.compile(r"^# AOT ID: .*$", re.MULTILINE)  # the header line naming the graph's number in its process


def build(route: Route, ctx: BuildContext) -> Artifact:
    """Compile `route` at every served shape, warm it up, and write its generated code to `ctx.out_dir/inductor.tar`."""
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
    if "shapes" in timings:  # which graphs each shape compiled to (the deterministic part of the per-shape record)
        manifest["shapes"] = [{"inputs": s["inputs"], "graphs": s["graphs"]} for s in timings["shapes"]]
    ctx.log(
        f"inductor: source in {timings['source_s']:.2f} s, compiled and warmed up in {timings['compile_s']:.2f} s, "
        f"{len(codes)} graph(s), cache hits {timings['cache_hits']}"
        + "".join(
            f"; at {s['inputs']}: {s['graphs']} graph(s) in {s['compile_s']:.2f} s" for s in timings.get("shapes", [])
        )
    )
    path = ctx.out_dir / ARTIFACT
    pack(codes, manifest, path)
    return Artifact(path, time.perf_counter() - t0, {**manifest, **timings}, handle=engine)


def rebuild(
    artifact_path: Path, route: Route, model: ModelInfo, feed: Feed, work_dir: Path, log: Callable[[str], None]
) -> Engine:
    """An engine for a stored artifact: recompile its route at every served shape (from the shared cache) and compare
    the code with the artifact's (its graph files, so an artifact hashed another way compares all the same)."""
    engine, codes, _ = compile_engine(route, model, feed, work_dir)
    if code_digest(stored_codes(artifact_path)) != code_digest(codes):
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
    """The engine for `route`, compiled and warmed up at every served shape, the output code of its graphs (shape by
    shape, in compile order), and timings; with `[[objective.shapes]]` the timings have each shape's in `shapes`."""
    import torch
    from torch._dynamo.utils import counters

    options = compile_options(route, model.options)
    device = resolve_device(model.options)
    if device == "cuda" and not torch.cuda.is_available():
        raise BuildError("backend.options.device = 'cuda' but torch sees no CUDA device")
    cache_dir(work_dir)
    t0 = time.perf_counter()
    examples = served_feeds(model, feed)
    modules, output_names = load_source(model, examples)
    source_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    hits = _cache_hits(counters)
    names = list(model.input_shapes)
    engine = Engine.create(
        {shapes_of([f[n] for n in names]): m for f, m in zip(examples, modules)},
        route,
        device,
        names,
        output_names,
        options,
    )
    codes, per_shape = _warm_up_each(engine, examples, bool(model.shapes))
    timings: dict[str, Any] = {
        "source_s": round(source_s, 4),
        "compile_s": round(time.perf_counter() - t1, 4),
        "cache_hits": _cache_hits(counters) - hits,
    }
    if model.shapes:
        timings["shapes"] = per_shape
    return engine, codes, timings


def _warm_up_each(engine: Engine, examples: list[Feed], name_shape: bool) -> tuple[list[str], list[dict[str, Any]]]:
    """Warm `engine` up on each example (compiling its module for that shape): the output code of every graph, and
    per shape its inputs, graph count, seconds and cache hits. `name_shape`: name the shape in an error."""
    from torch._dynamo.utils import counters

    codes: list[str] = []
    per_shape = []
    for example in examples:
        t, hits = time.perf_counter(), _cache_hits(counters)
        shape_codes = _warm_up(engine, example)
        inputs = {n: list(example[n].shape) for n in engine.input_names}
        if not shape_codes:
            at = f" at {inputs}" if name_shape else ""
            raise BuildError(f"Inductor generated no code for this model{at} (it ran eagerly)")
        codes += shape_codes
        per_shape.append(
            {
                "inputs": inputs,
                "graphs": len(shape_codes),
                "compile_s": round(time.perf_counter() - t, 4),
                "cache_hits": _cache_hits(counters) - hits,
            }
        )
    return codes, per_shape


def _warm_up(engine: Engine, feed: Feed) -> list[str]:
    """Run `engine` on `feed` until every compilation has happened; the output code generated meanwhile."""
    codes: list[str] = []
    try:
        with capture_output_code(codes.append):
            args = engine.inputs(feed)
            for _ in range(WARMUP_CALLS):
                engine.forward(args)
            engine.synchronize()
    except Exception as exc:  # Dynamo/Inductor raise many types (BackendCompilerFailed, Unsupported, ...)
        raise BuildError(f"torch.compile: {type(exc).__name__}: {first_line(exc)[:400]}") from exc
    return codes


def served_feeds(model: ModelInfo, feed: Feed) -> list[Feed]:
    """One example feed per shape the engine serves (`ModelInfo.served`), for tracing and the warm-up compile.

    `feed` (the study's first validation feed) where an input has the shape's size, else its values repeated
    to fill it (`numpy.resize`): real values, so a model whose shapes follow its data traces as it runs.
    """
    return [
        {
            name: feed[name] if feed[name].shape == tuple(inputs[name]) else np.resize(feed[name], inputs[name])
            for name in model.input_shapes
        }
        for inputs, _ in model.served()
    ]


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


def load_source(model: ModelInfo, examples: list[Feed]) -> tuple[list[Any], list[str]]:
    """The eager torch module for each example feed's shapes (onnx2torch or backend.options.module) and the output
    names.

    onnx2torch's module is specialised to each example's shapes (`static_shapes`); beyond the first, each
    specialises a copy of its graph that shares the weights. A backend.options.module module serves them all.
    """
    output_names = _onnx_outputs(model.path)
    target = MODULE.get(model.options)
    if target:
        return [_from_function(str(target), model)] * len(examples), output_names
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
    modules = [module, *(_sharing_weights(module) for _ in examples[1:])]
    return [static_shapes(m, [f[n] for n in model.input_shapes]) for m, f in zip(modules, examples)], output_names


def _sharing_weights(module: Any) -> Any:
    """A GraphModule with a copy of `module`'s graph and the same submodules, parameters and buffers."""
    import torch

    return torch.fx.GraphModule(module, copy.deepcopy(module.graph))


def static_shapes(module: Any, example: list[Any]) -> Any:
    """Specialise onnx2torch's shape-taking modules to the input shapes of `example` (one served shape).

    onnx2torch passes a Reshape's target shape and a Pad's pads as tensors: Dynamo cannot trace
    `torch.Size(tensor)` (an internal error) and breaks the graph at every `pads.tolist()`. Each
    compiled module serves one fixed shape, so one eager run through `torch.fx.Interpreter` records each
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
    served = [[tuple(inputs[n]) for n in model.input_shapes] for inputs, _ in model.served()]
    if shapes not in served:
        raise BuildError(
            f"{target}: example inputs have shapes {shapes}; the study's inputs are {' or '.join(map(str, served))}"
        )
    return module.eval()


def _onnx_outputs(path: Path) -> list[str]:
    import onnx

    return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]


def code_digest(codes: list[str]) -> str:
    """sha256 over the output code of every graph, in compile order, without its `# AOT ID` line: Inductor numbers the
    graphs a process compiles, so the same graph compiled after others, or read from the shared cache as another
    process wrote it, names another AOT ID in otherwise equal code."""
    h = hashlib.sha256()
    for code in codes:
        h.update(AOT_ID_LINE.sub("", code).encode())
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


def stored_codes(path: Path) -> list[str]:
    """The output code of every graph in the artifact `path` (`pack`'s `graph_NNN.py` files), in compile order."""
    with tarfile.open(path) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith("graph_")]
        return [tar.extractfile(m).read().decode() for m in members]  # type: ignore[union-attr]


def _cache_hits(counters: Any) -> int:
    """Graphs served from Inductor's caches so far: AOTAutograd-cache hits plus FX-graph-cache hits."""
    return int(counters["aot_autograd"]["autograd_cache_hit"] + counters["inductor"]["fxgraph_cache_hit"])
