"""Which nodes int8 hurts most: a per-node pass, measured once per prepared model and kept by content.

The prepared model is quantized once with the reference recipe (U8S8 Q/DQ, per-channel, MinMax,
this CPU's `reduce_range`); both graphs are run on a few feeds with every node output exposed, and
a node's sensitivity is the relative error its output gains over the worst of its inputs — the
noise that node's own quantization adds. Mixed-precision routes (`fp32_nodes = k`) keep the k
highest in fp32 (`nodes_to_exclude`).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from tuner.backends.onnxruntime.quantize import quantize
from tuner.backends.onnxruntime.recipe import QuantOptions
from tuner.measure.inputs import Feed

FEEDS = 4  # feeds the pass runs on


def ranking(prepared: Path, key: str, feeds: list[Feed], cache_dir: Path, reduce_range: bool) -> list[str]:
    """Quantizable node names of `prepared`, most sensitive first (cached as `sensitivity.<key>.json`)."""
    path = cache_dir / f"sensitivity.{key}.json"
    if path.exists():
        return list(json.loads(path.read_text())["ranking"])
    scores = measure(prepared, feeds[:FEEDS], reduce_range)
    order = sorted(scores, key=lambda n: (-scores[n], n))
    with tempfile.NamedTemporaryFile("w", dir=cache_dir, prefix=".sens-", delete=False) as f:
        json.dump({"ranking": order, "scores": {n: round(scores[n], 6) for n in order}}, f)
    Path(f.name).replace(path)
    return order


def measure(prepared: Path, feeds: list[Feed], reduce_range: bool) -> dict[str, float]:
    """Per node with quantized weights (Conv, MatMul, Gemm, ...): relative output error minus the worst input's."""
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        qpath = Path(tmp) / "q.onnx"
        quantize(prepared, qpath, QuantOptions("static", reduce_range=reduce_range), feeds, [])
        qgraph = onnx.load(str(qpath)).graph
        weights = {i.name for i in qgraph.initializer}
        dq_weights = {
            o for n in qgraph.node if n.op_type == "DequantizeLinear" and n.input[0] in weights for o in n.output
        }
        quantized = {n.name for n in qgraph.node if n.op_type != "DequantizeLinear" and set(n.input) & dq_weights}
        fgraph = onnx.load(str(prepared), load_external_data=False).graph
        nodes = [n for n in fgraph.node if n.name in quantized]
        tensors = sorted({t for n in nodes for t in (*n.input, *n.output) if t})
        ref = _run_exposed(prepared, tensors, feeds, Path(tmp) / "f.onnx")
        got = _run_exposed(qpath, tensors, feeds, Path(tmp) / "q2.onnx")
    err = {t: _rel_err(got[t], ref[t]) for t in tensors if t in ref and t in got}
    return {
        n.name: max((err[o] for o in n.output if o in err), default=0.0)
        - max((err[i] for i in n.input if i in err), default=0.0)
        for n in nodes
    }


def _run_exposed(model: Path, tensors: list[str], feeds: list[Feed], scratch: Path) -> dict[str, list[np.ndarray]]:
    """Every feed's values of `tensors` that `model` computes (made graph outputs in a scratch copy)."""
    import onnx
    import onnxruntime as ort

    m = onnx.load(str(model))
    present = {o for n in m.graph.node for o in n.output} | {i.name for i in m.graph.input}
    names = [t for t in tensors if t in present and t not in {o.name for o in m.graph.output}]
    m.graph.output.extend(onnx.ValueInfoProto(name=t) for t in names)
    onnx.save(m, str(scratch))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(scratch), so, providers=["CPUExecutionProvider"])
    wanted = [o.name for o in sess.get_outputs()]
    values: dict[str, list[np.ndarray]] = {}
    for feed in feeds:
        for name, value in zip(wanted, sess.run(wanted, feed)):
            values.setdefault(name, []).append(np.asarray(value))
    for i in m.graph.input:
        if i.name in tensors:
            values[i.name] = [np.asarray(f[i.name]) for f in feeds]
    return values


def _rel_err(got: list[np.ndarray], ref: list[np.ndarray]) -> float:
    if not ref or not np.issubdtype(ref[0].dtype, np.floating):
        return 0.0
    num = sum(float(np.sum((g.astype(np.float64) - r) ** 2)) for g, r in zip(got, ref) if g.shape == r.shape)
    den = sum(float(np.sum(r.astype(np.float64) ** 2)) for r in ref)
    return float(np.sqrt(num / den)) if den > 0 else 0.0
