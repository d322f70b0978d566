"""Graph repairs and checks applied to every precision variant before it is kept.

Converters (ONNX Runtime's fp16 cast, its quantizers) can leave graphs that ONNX Runtime accepts but
strict parsers refuse: nodes out of topological order, the same Cast emitted twice under one output
name (ONNX Runtime 1.30's fp16 converter, once per blocked consumer), Q/DQ pairs with a zero scale
(fp8 calibration of a constant such as a Pad value, or of an activation that is always zero).
`repair` fixes what can be fixed without changing the computation; `problems` lists what is still
wrong, so a variant that a compiler would refuse fails here with one line naming the node.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np


def repair(model: Any) -> Any:
    """Drop duplicate identical nodes and degenerate Q/DQ pairs, then sort the graph topologically."""
    graph = model.graph
    _dedupe(graph)
    _drop_degenerate_qdq(graph)
    _unique_subgraph_names(graph, _defined(graph))
    topological_sort(graph)
    return model


def problems(model: Any) -> list[str]:
    """What would make a strict parser refuse `model`: SSA violations, order, non-positive Q/DQ scales."""
    graph = model.graph
    out: list[str] = [
        f"subgraph of node {n.name or n.op_type!r}: {name!r} is already defined outside it"
        for n, name in _subgraph_clashes(graph, _defined(graph))
    ]
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    produced: set[str] = set()
    for node in graph.node:
        for name in node.output:
            if name and (name in produced or name in defined):
                out.append(f"node {node.name or node.op_type!r}: output {name!r} is defined more than once")
            produced.add(name)
    available = set(defined)
    for node in graph.node:
        missing = [x for x in _needs(node) if x not in available]
        if missing:
            out.append(
                f"node {node.name or node.op_type!r}: input {missing[0]!r} is not produced before it (graph not "
                "topologically sorted)"
            )
        available.update(o for o in node.output if o)
    values = _constant_values(graph)
    for node in graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and len(node.input) > 1:
            scale = values.get(node.input[1])
            if scale is not None and not _positive(scale):
                out.append(
                    f"node {node.name or node.op_type!r}: Q/DQ scale {node.input[1]!r} is not all positive and finite"
                )
    return out


def topological_sort(graph: Any) -> None:
    """Reorder `graph.node` so every node follows the producers of its inputs (stable: ties keep order)."""
    nodes = list(graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    deps: list[set[int]] = []
    users: dict[int, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        d = {producer[x] for x in _needs(node) if x in producer and producer[x] != i}
        deps.append(d)
        for j in d:
            users[j].append(i)
    ready = [i for i, d in enumerate(deps) if not d]
    order: list[int] = []
    waiting = [len(d) for d in deps]
    heapq.heapify(ready)
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        stuck = next(nodes[i] for i in range(len(nodes)) if waiting[i] > 0)
        raise ValueError(f"graph has a cycle through node {stuck.name or stuck.op_type!r}")
    del graph.node[:]
    graph.node.extend(nodes[i] for i in order)


def _needs(node: Any) -> Iterator[str]:
    """The outer-graph names `node` reads: its inputs and the free names of its subgraphs."""
    yield from (x for x in node.input if x)
    yield from subgraph_reads(node)


def subgraph_reads(node: Any) -> Iterator[str]:
    """The names `node`'s subgraphs (If branches, Loop and Scan bodies, nested) read from the outer scope."""
    for graph in _subgraphs(node):
        local = (
            {i.name for i in graph.input}
            | {i.name for i in graph.initializer}
            | {o for n in graph.node for o in n.output}
        )
        for inner in graph.node:
            yield from (x for x in _needs(inner) if x not in local)
        yield from (o.name for o in graph.output if o.name not in local)  # an output that names an outer value


def _defined(graph: Any) -> set[str]:
    """Names `graph` itself defines: inputs, initializers, node outputs."""
    return (
        {i.name for i in graph.input}
        | {i.name for i in graph.initializer}
        | {o for n in graph.node for o in n.output if o}
    )


def _subgraph_clashes(graph: Any, taken: set[str]) -> Iterator[tuple[Any, str]]:
    """(node, name) for each name a subgraph defines that is already defined elsewhere in the model."""
    for node in graph.node:
        for sub in _subgraphs(node):
            for name in sorted(_defined(sub)):
                if name in taken:
                    yield node, name
                taken.add(name)
            yield from _subgraph_clashes(sub, taken)


def _unique_subgraph_names(graph: Any, taken: set[str]) -> None:
    """Rename, inside each subgraph, names it defines that clash with names defined elsewhere (the fp16
    converter inserts the same Cast of an outer value into both branches of an If)."""
    for node in graph.node:
        for sub in _subgraphs(node):
            renames: dict[str, str] = {}
            for name in sorted(_defined(sub)):
                if name in taken:
                    k = 1
                    while f"{name}__{k}" in taken:
                        k += 1
                    renames[name] = f"{name}__{k}"
                taken.add(renames.get(name, name))
            if renames:
                _rename(sub, renames)
            _unique_subgraph_names(sub, taken)


def _rename(graph: Any, renames: dict[str, str]) -> None:
    """Apply `renames` to every use and definition in `graph` and the subgraphs inside it."""
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info) + list(graph.initializer):
        vi.name = renames.get(vi.name, vi.name)
    for node in graph.node:
        for k, x in enumerate(node.input):
            node.input[k] = renames.get(x, x)
        for k, x in enumerate(node.output):
            node.output[k] = renames.get(x, x)
        for sub in _subgraphs(node):
            _rename(sub, renames)


def _subgraphs(node: Any) -> Iterable[Any]:
    """The graphs held in `node`'s attributes (If branches, Loop and Scan bodies)."""
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.g
        yield from attr.graphs


def _dedupe(graph: Any) -> None:
    """Remove nodes identical (op, inputs, outputs, attributes) to an earlier one."""
    seen: set[bytes] = set()
    keep = []
    for node in graph.node:
        key = _without_name(node)
        if key in seen:
            continue
        seen.add(key)
        keep.append(node)
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)


def _without_name(node: Any) -> bytes:
    """The node's serialised form with its name cleared (names need not be unique or present)."""
    copy = type(node)()
    copy.CopyFrom(node)
    copy.name = ""
    return copy.SerializeToString(deterministic=True)


def _drop_degenerate_qdq(graph: Any) -> None:
    """Remove QuantizeLinear -> DequantizeLinear pairs whose scale is not positive: they quantize nothing."""
    values = _constant_values(graph)
    consumers: dict[str, list[Any]] = defaultdict(list)
    for node in graph.node:
        for x in node.input:
            consumers[x].append(node)
    graph_outputs = {o.name for o in graph.output}
    rename: dict[str, str] = {}
    drop: set[int] = set()
    for q in graph.node:
        if q.op_type != "QuantizeLinear" or len(q.input) < 2:
            continue
        scale = values.get(q.input[1])
        users = consumers[q.output[0]]
        if scale is None or _positive(scale) or q.output[0] in graph_outputs or not users:
            continue
        if not all(u.op_type == "DequantizeLinear" and u.output[0] not in graph_outputs for u in users):
            continue
        drop.add(id(q))
        for dq in users:
            drop.add(id(dq))
            rename[dq.output[0]] = q.input[0]
    if not drop:
        return
    keep = [n for n in graph.node if id(n) not in drop]
    for node in keep:
        for k, x in enumerate(node.input):
            if x in rename:
                node.input[k] = rename[x]
    del graph.node[:]
    graph.node.extend(keep)
    used = {x for n in graph.node for x in _needs(n)} | graph_outputs
    kept_inits = [i for i in graph.initializer if i.name in used]
    if len(kept_inits) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept_inits)


def _constant_values(graph: Any) -> dict[str, np.ndarray]:
    """Initializers and Constant-node outputs of `graph`, as arrays (float types only are needed)."""
    from onnx import numpy_helper

    out = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    out[node.output[0]] = numpy_helper.to_array(attr.t)
    return out


def _positive(scale: np.ndarray) -> bool:
    """Every value of `scale` is finite and above zero (what TensorRT requires of a Q/DQ scale)."""
    values = np.asarray(scale, dtype=np.float64)
    return bool(np.all(np.isfinite(values)) and np.all(values > 0))
