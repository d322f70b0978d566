"""The precision a model already has: fp32, already reduced to fp16/bf16, or already quantized.

A variant is made from the model as given, so a model that is already quantized (Q/DQ pairs, QLinear*
or integer operators) or already in fp16/bf16 takes no further precision variant: quantizing a
quantized graph, or casting a half-precision one, fails (a missing `*_scale` tensor, an invalid graph)
or changes nothing. `tuner space` says what it found; the backends offer only `fp32`, which means
"the graph as given", for such a model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AS_GIVEN = "fp32"  # the precision value that builds the graph as it is (no variant)

# Operators that only a quantized graph holds (ONNX and ONNX Runtime's com.microsoft domain); every QLinear* too.
QUANTIZED_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "ConvInteger",
        "MatMulInteger",
        "QGemm",
        "QAttention",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
        "DynamicQuantizeLSTM",
        "MatMulNBits",
        "MatMulBnb4",
        "GatherBlockQuantized",
    }
)


@dataclass(frozen=True)
class GivenPrecision:
    """What precision the model's graph already has: `kind` is "fp32", "fp16", "bf16" or "quantized"."""

    kind: str
    evidence: str = ""  # what shows it: the quantized operators with counts, or the share of half-precision weights

    @property
    def reduced(self) -> bool:
        """Whether the model is already quantized or in half precision (so no variant applies)."""
        return self.kind != AS_GIVEN

    def applicable(self, precisions: Sequence[str]) -> tuple[str, ...]:
        """The precision values of `precisions` that can apply to this model (only the graph as given, if reduced)."""
        return (AS_GIVEN,) if self.reduced else tuple(precisions)

    @property
    def note(self) -> str:
        """One line for `tuner space` and `tuner init`: what the model already is, and that no variant is offered."""
        if not self.reduced:
            return ""
        return (
            f"the model is already {self.kind} ({self.evidence}): no precision variant is offered; "
            f"precision {AS_GIVEN} builds the graph as given"
        )


def given_precision(path: Path) -> GivenPrecision:
    """The precision of the ONNX model at `path` (its weights are not read)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    types = (n.op_type for n in _nodes(model.graph))
    ops = Counter(op for op in types if op in QUANTIZED_OPS or op.startswith("QLinear"))
    if ops:
        most_first = sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))
        return GivenPrecision("quantized", ", ".join(f"{op} x{n}" for op, n in most_first))
    counts = _float_elements(model.graph)
    half = max(("fp16", "bf16"), key=lambda k: counts[k])
    total = sum(counts.values())
    if total and counts[half] * 2 > total:
        return GivenPrecision(half, f"{counts[half] / total:.0%} of its floating-point weights are {half}")
    return GivenPrecision(AS_GIVEN)


def _nodes(graph: Any) -> Iterator[Any]:
    """Every node of `graph` and of the subgraphs inside it (If, Loop, Scan bodies)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _nodes(sub)


def _float_elements(graph: Any) -> Counter[str]:
    """Weight elements by floating-point type ("fp32", "fp16", "bf16"), from the initializers' shapes."""
    from onnx import TensorProto

    names = {
        TensorProto.FLOAT: "fp32",
        TensorProto.DOUBLE: "fp32",
        TensorProto.FLOAT16: "fp16",
        TensorProto.BFLOAT16: "bf16",
    }
    counts: Counter[str] = Counter({"fp32": 0, "fp16": 0, "bf16": 0})
    for init in graph.initializer:
        if init.data_type in names:
            size = 1
            for d in init.dims:
                size *= d
            counts[names[init.data_type]] += size
    return counts
