"""ONNX Runtime int8 variants made with ONNX Runtime's own quantizer (`onnxruntime.quantization`).

A variant is a content-addressed file (its name is its product key, see `products`), made once per
study from the *prepared* model and shared by every worker. Each variant is loaded once by ONNX
Runtime with graph optimisation off before it is accepted, so a graph ORT cannot load is a failed
variant (learned once) rather than a failure of every session route that uses it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import onnx
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

from tuner.backends.onnxruntime.recipe import QuantOptions
from tuner.measure.inputs import Feed
from tuner.precision.graph import subgraph_reads

_TYPES = {"U8": "QUInt8", "S8": "QInt8"}


def quantize(prepared: Path, out: Path, opts: QuantOptions, feeds: list[Feed], exclude: list[str]) -> None:
    """Write the int8 model of `prepared` per `opts` to `out` (`exclude`: node names kept in fp32)."""
    weight = getattr(QuantType, _TYPES[opts.weight])
    if opts.mode == "dynamic":
        quantize_dynamic(
            str(prepared),
            str(out),
            op_types_to_quantize=opts.op_types(),
            per_channel=opts.per_channel,
            reduce_range=opts.reduce_range,
            weight_type=weight,
            nodes_to_exclude=exclude,
            extra_options={"WeightSymmetric": opts.weight_symmetric},
        )
    else:
        _static(prepared, out, opts, feeds, exclude)
    check_loads(out)


def _static(prepared: Path, out: Path, opts: QuantOptions, feeds: list[Feed], exclude: list[str]) -> None:
    if opts.quant_format == "qoperator":
        exclude = exclude + [
            n for n in outer_scope_producers(onnx.load(str(prepared), load_external_data=False)) if n not in exclude
        ]
    extra: dict[str, object] = {
        "ActivationSymmetric": opts.activation_symmetric,
        "WeightSymmetric": opts.weight_symmetric,
    }
    if opts.calibration == "percentile":
        extra["CalibPercentile"] = opts.percentile
    method = {
        "minmax": CalibrationMethod.MinMax,
        "percentile": CalibrationMethod.Percentile,
        "entropy": CalibrationMethod.Entropy,
    }
    quantize_static(
        str(prepared),
        str(out),
        FeedReader(feeds),
        quant_format=QuantFormat.QDQ if opts.quant_format == "qdq" else QuantFormat.QOperator,
        op_types_to_quantize=opts.op_types(),
        per_channel=opts.per_channel,
        reduce_range=opts.reduce_range,
        activation_type=getattr(QuantType, _TYPES[opts.activation]),
        weight_type=getattr(QuantType, _TYPES[opts.weight]),
        nodes_to_exclude=exclude,
        calibrate_method=method[opts.calibration],
        extra_options=extra,
    )


def outer_scope_producers(model: onnx.ModelProto) -> list[str]:
    """Names of the main graph's nodes whose outputs a subgraph (If/Loop/Scan body) reads from the outer scope.

    ONNX Runtime's QOperator quantizer renames a quantized node's output and adds a DequantizeLinear only
    for the consumers it sees; a subgraph's implicit read is not one of them, so the tensor vanishes and
    the model no longer loads. Keeping these producers in fp32 keeps the tensor.
    """
    read = {name for node in model.graph.node for name in subgraph_reads(node)}
    return [n.name for n in model.graph.node if read.intersection(n.output)]


def check_loads(model: Path) -> None:
    """Raise unless ONNX Runtime loads `model` (graph optimisation off: the graph itself is checked)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])


class FeedReader(CalibrationDataReader):
    """ONNX Runtime's calibration reader over the study's validation feeds."""

    def __init__(self, feeds: list[Feed]) -> None:
        self.feeds = feeds
        self._it: Iterator[Feed] = iter(feeds)

    def get_next(self) -> Feed | None:
        """The next feed, or None when all were read."""
        return next(self._it, None)

    def rewind(self) -> None:
        """Start again from the first feed."""
        self._it = iter(self.feeds)
