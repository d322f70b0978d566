"""ONNX Runtime's int8 knobs, with ONNX Runtime's own recommendations for this CPU as their defaults.

From `onnxruntime.quantization.quantize_static`'s guidance ("Choosing parameters for CPU inference"):
QDQ is the CPU format since ORT 1.11; on x86 use U8 activations with S8 weights (U8S8), with
`reduce_range` on CPUs without VNNI (7-bit weights avoid saturating the 16-bit accumulation) and
off with VNNI; on ARM, S8S8. Knobs that only matter together are conditional: S8S8 is offered in
QDQ only (ORT warns QOperator S8S8 is slow on x64), Q/DQ graphs run only at the graph levels that
fuse them (`int8_graph_level`), a percentile only with percentile calibration.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tuner.space import Param
from tuner.space.params import Value

QUANT_TYPES = ("U8S8", "S8S8", "U8U8")  # activation type, weight type
OP_GROUPS = ("Conv", "MatMul", "Gemm")  # quantize only this op type; "all": every op ORT can quantize
FP32_NODES = (0, 1, 2, 4, 8)  # the k most accuracy-sensitive nodes kept in fp32 (mixed precision)
PERCENTILES = (99.99, 99.999, 99.9999)


@dataclass(frozen=True)
class Recommendation:
    """What ONNX Runtime's documentation recommends on this CPU."""

    quant_types: str
    reduce_range: bool
    reason: str


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of this machine (empty where /proc/cpuinfo is unreadable)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def recommendation(machine: str | None = None, flags: frozenset[str] | None = None) -> Recommendation:
    """ONNX Runtime's recommended int8 types and `reduce_range` for a CPU (this one by default)."""
    machine = (machine or platform.machine()).lower()
    flags = cpu_flags() if flags is None else flags
    if machine in ("aarch64", "arm64") or machine.startswith("arm"):
        return Recommendation("S8S8", False, "ARM: symmetric S8 activations and S8 weights")
    if flags & {"avx512_vnni", "avx_vnni", "amx_int8"}:
        return Recommendation("U8S8", False, "x86 with VNNI: U8 activations, S8 weights, full 8-bit range")
    return Recommendation("U8S8", True, "x86 without VNNI: U8 activations, S8 weights, reduce_range (7-bit weights)")


def model_op_types(path: Path) -> frozenset[str]:
    """The op types of a model's main graph (the weights are not read)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return frozenset(n.op_type for n in model.graph.node)


def _static(r: Mapping[str, Value]) -> bool:
    return r.get("precision") == "int8_static"


def _int8(r: Mapping[str, Value]) -> bool:
    return str(r.get("precision", "")).startswith("int8")


def quant_params(op_types: frozenset[str], rec: Recommendation | None = None) -> list[Param]:
    """The int8 knobs for a model with `op_types` (sampled after `precision`)."""
    rec = rec or recommendation()
    groups = tuple(g for g in OP_GROUPS if g in op_types)
    params = [
        Param(
            "quant_types", QUANT_TYPES, rec.quant_types, f"int8 activation/weight types ({rec.reason})", when=_static
        ),
        Param(
            "quant_format",
            ("qdq", "qoperator"),
            "qdq",
            "QuantizeLinear/DequantizeLinear pairs or QLinear* operators",
            when=lambda r: _static(r) and r.get("quant_types") != "S8S8",
        ),
        Param(
            "activation_symmetric",
            (False, True),
            False,
            "symmetric activation ranges (zero point at the middle)",
            when=_static,
        ),
        Param("weight_symmetric", (True, False), True, "symmetric weight ranges", when=_static),
        Param(
            "weight_type",
            ("S8", "U8"),
            "S8",
            "dynamic int8 weight type",
            when=lambda r: r.get("precision") == "int8_dynamic",
        ),
        Param(
            "reduce_range",
            (rec.reduce_range, not rec.reduce_range),
            rec.reduce_range,
            "7-bit weights (ORT: on for x86 without VNNI)",
            when=_int8,
        ),
        Param("per_channel", (True, False), True, "per-channel int8 weight scales", when=_int8),
        Param("calibration", ("minmax", "percentile", "entropy"), "minmax", "int8 calibration method", when=_static),
        Param(
            "percentile",
            PERCENTILES,
            99.999,
            "percentile calibration: the kept percentile of each activation",
            when=lambda r: _static(r) and r.get("calibration") == "percentile",
        ),
    ]
    if len(groups) > 1:
        params.append(Param("quant_ops", ("all", *groups), "all", "which op types are quantized", when=_int8))
    params += [
        Param(
            "fp32_nodes",
            FP32_NODES,
            0,
            "mixed precision: the k most sensitive nodes (measured once per model) stay fp32",
            when=_static,
        ),
        Param(
            "int8_graph_level",
            ("all", "extended"),
            "all",
            "ORT graph level for int8 (only these fuse Q/DQ into int8 kernels)",
            when=_static,
        ),
    ]
    return params
