"""Build an ONNX Runtime route: transformer fusions -> preparation -> precision variant -> ORT-optimised ONNX file.

Every intermediate product is a content-addressed file under `work_dir/variants` (see `products`);
one that fails is recorded in the study's `FailureBook` before the error is raised, so no later
route builds it again. What is built must load: when the file ONNX Runtime optimised offline does
not load again (it can write models with subgraphs, If/Loop, that fail its own checker), the
artifact is the variant itself, marked to be optimised at the route's level when it is loaded
(`session.mark_load_level`); the artifact's `graph_optimization` says which was done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tuner.backends.base import Artifact, BuildContext, BuildError
from tuner.backends.onnxruntime.products import FailureBook, Product, fusion_switches, products, sensitivity_key
from tuner.backends.onnxruntime.quant_space import recommendation
from tuner.backends.onnxruntime.recipe import QuantOptions
from tuner.backends.onnxruntime.session import AT_LOAD, OFFLINE, PROVIDERS, graph_level, mark_load_level
from tuner.errors import first_line
from tuner.files import atomic_path
from tuner.measure.inputs import feeds_hash, file_hash
from tuner.precision import VariantOptions, make_variant
from tuner.space import Route

T = TypeVar("T")


def build(route: Route, ctx: BuildContext) -> Artifact:
    """Write `engine.onnx` for `route` into `ctx.out_dir`: optimised offline, or (if that file does not load) at
    load."""
    import onnxruntime as ort

    t0 = time.perf_counter()
    variant = model_for(route, ctx)
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    out = ctx.out_dir / "engine.onnx"
    providers = PROVIDERS[str(route["provider"])]
    opts = ort.SessionOptions()
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, graph_level(route))
    opts.optimized_model_filepath = str(out)
    opts.log_severity_level = 3
    try:
        ort.InferenceSession(str(variant), opts, providers=providers)
    except Exception as exc:  # onnxruntime raises its own Fail/NotImplemented/InvalidGraph types
        raise BuildError(f"{type(exc).__name__}: {first_line(exc)}") from exc
    if not out.exists():
        raise BuildError("ONNX Runtime wrote no optimised model")
    info = {"variant": variant.name, "graph_optimization": OFFLINE}
    refused = _load_problem(out, providers)
    if refused:
        mark_load_level(variant, out, graph_level(route))
        info.update(graph_optimization=AT_LOAD, offline_file_refused=refused[:300])
        ctx.log(f"the offline-optimised model does not load ({refused[:200]}); shipping the variant, optimised at load")
    return Artifact(out, time.perf_counter() - t0, info)


def _load_problem(path: Path, providers: list[str]) -> str | None:
    """Why ONNX Runtime refuses to load `path` as it is (graph optimisation off), or None when it loads."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    try:
        ort.InferenceSession(str(path), opts, providers=providers)
    except Exception as exc:  # onnxruntime raises its own InvalidGraph/Fail types
        return f"{type(exc).__name__}: {first_line(exc)}"
    return None


def model_for(route: Route, ctx: BuildContext) -> Path:
    """The ONNX file the route's session loads: fused, prepared and converted as the route asks."""
    data_sha = feeds_hash(ctx.calibration)
    needed = products(route, file_hash(ctx.model.path), ctx.model.options, data_sha)
    book = FailureBook(ctx.work_dir)
    known = book.lookup(needed)
    if known:
        raise BuildError(f"{known[0].kind} {known[0].key} failed before: {known[1]}")
    stage = {p.kind: p for p in needed}
    cache = ctx.work_dir / "variants"
    source = ctx.model.path
    if "fused" in stage:
        source = _made(book, stage["fused"], lambda: _fused(source, route, ctx, stage["fused"].key))
    recipe = QuantOptions.from_route(route)
    if recipe is not None:
        from tuner.backends.onnxruntime.prepare import prepare

        prepared = _made(book, stage["prepared"], lambda: prepare(source, stage["prepared"].key, cache, ctx.log).path)
        return _made(book, stage["variant"], lambda: _int8(prepared, recipe, stage, data_sha, ctx))
    if "variant" in stage:
        opts = VariantOptions(str(route["precision"]), str(route.get("keep_fp32", "none")))
        return _made(book, stage["variant"], lambda: make_variant(source, opts, ctx.calibration, cache))
    return source


def _made(book: FailureBook, product: Product, make: Callable[[], T]) -> T:
    """`make()`, or record the product as failed and raise BuildError."""
    try:
        return make()
    except Exception as exc:  # converters and quantizers raise many types; all mean "this product cannot be made"
        message = f"{product.kind}: {type(exc).__name__}: {str(exc).strip()[:500]}"
        book.record(product, message)
        raise BuildError(message) from exc


def _int8(prepared: Path, recipe: QuantOptions, stage: dict[str, Product], data_sha: str, ctx: BuildContext) -> Path:
    """The int8 variant of the prepared model (kept by key; mixed precision reads the cached sensitivity)."""
    cache = ctx.work_dir / "variants"
    out = cache / f"{ctx.model.path.stem}.int8.{stage['variant'].key}.onnx"
    if out.exists():
        return out  # made before: no quantizer to import (tens of milliseconds of every int8 trial's child)
    from tuner.backends.onnxruntime.quantize import quantize

    exclude: list[str] = []
    if recipe.fp32_nodes:
        from tuner.backends.onnxruntime.sensitivity import ranking

        reduce = recommendation().reduce_range
        exclude = ranking(
            prepared, sensitivity_key(stage["prepared"], data_sha, reduce), ctx.calibration, cache, reduce
        )[: recipe.fp32_nodes]
        ctx.log(f"kept in fp32 (most sensitive first): {', '.join(exclude)}")
    with atomic_path(out) as tmp:  # concurrent workers may both quantize; either result is identical
        quantize(prepared, tmp, recipe, ctx.calibration, exclude)
    return out


def _fused(model: Path, route: Route, ctx: BuildContext, key: str) -> Path:
    """The model after ONNX Runtime's transformer optimizer with the route's fusion switches (cached)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    opts = ctx.model.options
    cache = ctx.work_dir / "variants"
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"{model.stem}.fused.{key}.onnx"
    if out.exists():
        return out
    fusion = FusionOptions(str(opts["model_type"]))
    for attr, on in fusion_switches(route).items():
        setattr(fusion, attr, on)
    optimized = optimize_model(
        str(model),
        model_type=str(opts["model_type"]),
        num_heads=int(opts.get("num_heads", 0)),
        hidden_size=int(opts.get("hidden_size", 0)),
        optimization_options=fusion,
        opt_level=0,
    )
    with atomic_path(out) as tmp:
        optimized.save_model_to_file(str(tmp))
    ctx.log(f"transformer fusions: {optimized.get_fused_operator_statistics()}")
    return out
