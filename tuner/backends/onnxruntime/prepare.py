"""Model preparation before any int8 variant, made once per source model and kept by content.

Steps, each recorded (done, skipped with the reason, or failed with the error) in a JSON file beside
the prepared model, stored with the study and shown by `tuner space`:

1. **initializers**: weights fed through `Constant` nodes or `Identity` nodes of initializers (what
   paddle2onnx emits; ORT's quantizer expects initializers) become initializers; initializers listed
   as graph inputs (old IR) stop being inputs; every node gets a unique name (nodes to keep in fp32
   are named to the quantizer).
2. **opset**: a model below opset 13 is converted with ONNX's version converter (ORT's quantizer
   otherwise only relabels the opset for per-channel Q/DQ, which leaves an invalid graph).
3. **quant_pre_process**: ONNX Runtime's own pre-processing (symbolic shape inference, ORT's basic
   graph optimisation with constant folding, ONNX shape inference); without it the U8S8 recipe on
   EfficientNet-Lite0 loses most of its gain. Tried in full (symbolic shape inference needs sympy), then
   without symbolic shape inference; a fallback records why the full run failed.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import traceback
import types
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.files import atomic_write

QUANT_OPSET = 13


@dataclass(frozen=True)
class Prepared:
    """A prepared model file and what preparation did."""

    path: Path
    steps: list[dict[str, Any]]


def prepare(source: Path, key: str, cache_dir: Path, log: Any = print) -> Prepared:
    """The prepared model of `source` under `cache_dir` (named by `key`), made unless already there."""
    out = cache_dir / f"{source.stem}.prepared.{key}.onnx"
    record = out.with_suffix(".json")
    if out.exists() and record.exists():
        return Prepared(out, json.loads(record.read_text())["steps"])
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".prep-") as tmp:
        work = Path(tmp)
        steps = _run_steps(source, work)
        final = work / "model.onnx"
        final.replace(out)  # atomic; concurrent workers produce identical files
    atomic_write(record, json.dumps({"source": source.name, "key": key, "steps": steps}, indent=1))
    for step in steps:
        log(f"preparation {step['step']}: {step['status']} {step.get('detail', '')}".rstrip())
    return Prepared(out, steps)


def _run_steps(source: Path, work: Path) -> list[dict[str, Any]]:
    import onnx

    model = onnx.load(str(source))
    steps = [normalise_initializers(model), upgrade_opset(model)]
    plain = work / "normalised.onnx"
    onnx.save(model, str(plain))
    steps.append(_pre_process(plain, work / "model.onnx"))
    return steps


def normalise_initializers(model: Any) -> dict[str, Any]:
    """Turn Constant / Identity-of-initializer weights into initializers; name every node (in place)."""
    from onnx import numpy_helper

    graph = model.graph
    inits = {i.name for i in graph.initializer}
    outputs = {o.name for o in graph.output}
    folded: Counter[str] = Counter()
    keep = []
    for node in graph.node:
        out = node.output[0] if node.output else ""
        if node.op_type == "Constant" and out not in outputs and _constant_tensor(node) is not None:
            tensor = numpy_helper.from_array(numpy_helper.to_array(_constant_tensor(node)), out)
            graph.initializer.append(tensor)
            inits.add(out)
            folded["Constant"] += 1
            continue
        if node.op_type == "Identity" and node.input[0] in inits and out not in outputs:
            source = next(i for i in graph.initializer if i.name == node.input[0])
            copy = numpy_helper.from_array(numpy_helper.to_array(source), out)
            graph.initializer.append(copy)
            inits.add(out)
            folded["Identity"] += 1
            continue
        keep.append(node)
    del graph.node[:]
    graph.node.extend(keep)
    inputs = [i for i in graph.input if i.name not in inits]
    dropped = len(graph.input) - len(inputs)
    del graph.input[:]
    graph.input.extend(inputs)
    named = _name_nodes(graph)
    detail = ", ".join(f"{n} {k} node(s) folded" for k, n in sorted(folded.items()))
    detail = ", ".join(
        x
        for x in (
            detail,
            f"{dropped} initializer input(s) dropped" if dropped else "",
            f"{named} node(s) named" if named else "",
        )
        if x
    )
    return {"step": "initializers", "status": "done" if detail else "unchanged", "detail": detail}


def _constant_tensor(node: Any) -> Any:
    for attr in node.attribute:
        if attr.name == "value" and attr.HasField("t"):
            return attr.t
    return None


def _name_nodes(graph: Any) -> int:
    seen: set[str] = set()
    renamed = 0
    for i, node in enumerate(graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
            renamed += 1
        seen.add(node.name)
    return renamed


def upgrade_opset(model: Any) -> dict[str, Any]:
    """Convert a model below opset 13 to 13 with ONNX's version converter (in place)."""
    from onnx import version_converter

    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if current >= QUANT_OPSET:
        return {"step": "opset", "status": "unchanged", "detail": f"opset {current}"}
    try:
        converted = version_converter.convert_version(model, QUANT_OPSET)
    except Exception as exc:  # the converter raises its own C++ errors for ops it cannot adapt
        return {
            "step": "opset",
            "status": "failed",
            "detail": f"opset {current} -> {QUANT_OPSET}: {type(exc).__name__}: {exc}"[:300],
        }
    model.CopyFrom(converted)
    return {"step": "opset", "status": "done", "detail": f"opset {current} -> {QUANT_OPSET}"}


def _pre_process(src: Path, out: Path) -> dict[str, Any]:
    _keep_torch_out_of_ort_tools()
    from onnxruntime.quantization.shape_inference import quant_pre_process

    errors: list[str] = []
    src, out = src.resolve(), out.resolve()
    for label, kwargs in (("full", {}), ("without symbolic shape inference", {"skip_symbolic_shape": True})):
        try:
            # Symbolic shape inference that stops short saves its partial model as sym_shape_infer_temp.onnx in
            # the current directory: run it in a scratch folder of its own, removed afterwards.
            with tempfile.TemporaryDirectory(dir=out.parent) as scratch, contextlib.chdir(scratch):
                quant_pre_process(str(src), str(out), **kwargs)
            return {
                "step": "quant_pre_process",
                "status": "done",
                "detail": label + (f" ({errors[0]})" if errors else ""),
            }
        except Exception as exc:  # symbolic shape inference rejects some custom/contrib ops; try without
            errors.append(f"{label}: {_describe(exc)}")
    src.replace(out)
    return {"step": "quant_pre_process", "status": "failed", "detail": "; ".join(errors)}


def _describe(exc: Exception) -> str:
    """`Type: message` on one line; for an exception without a message (a bare `assert` in ONNX Runtime's tools),
    where it was raised instead."""
    text = " ".join(str(exc).split())[:240]
    if not text and exc.__traceback__ is not None:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        text = f"raised at {Path(frame.filename).name}:{frame.lineno}"
    return f"{type(exc).__name__}: {text}"


TORCH_HELPER = "onnxruntime.tools.pytorch_export_helpers"


def _keep_torch_out_of_ort_tools() -> None:
    """Keep symbolic shape inference from importing PyTorch (about 2 s of a core, once per process).

    `onnxruntime.tools`, whose `symbolic_shape_infer` the pre-processing uses, imports torch on import
    wherever torch is installed, only to offer `infer_input_info`, a helper for exporting PyTorch models
    that nothing here calls. Registering that one helper module first, as a stand-in that refuses to run,
    spares the import; it is skipped once `onnxruntime.tools` or torch is already loaded.
    """
    if TORCH_HELPER in sys.modules or "onnxruntime.tools" in sys.modules or "torch" in sys.modules:
        return
    helper = types.ModuleType(
        TORCH_HELPER, "Stand-in registered by tuner.backends.onnxruntime.prepare (PyTorch not imported)."
    )

    def infer_input_info(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError(
            f"{TORCH_HELPER} was not loaded in this process (route tuner kept PyTorch out of onnxruntime.tools)"
        )

    helper.infer_input_info = infer_input_info  # type: ignore[attr-defined]
    sys.modules[TORCH_HELPER] = helper
