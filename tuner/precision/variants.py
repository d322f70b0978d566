"""Make fp16/bf16 (casts with fp32 block lists) and int8/fp8 (Q/DQ, calibrated) ONNX variants."""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tuner.files import atomic_path
from tuner.measure.inputs import Feed, feeds_hash, file_hash

# Bumped whenever a converter's output changes, so variants cached by an older recipe are not reused.
RECIPE = 3
PRECISIONS = ("fp32", "fp16", "bf16", "int8_dynamic", "int8_static", "fp8_static")

# Normalisations and softmaxes: what fp16/bf16 most often breaks.
NORM_SOFTMAX = (
    "LayerNormalization",
    "SimplifiedLayerNormalization",
    "SkipLayerNormalization",
    "BatchNormalization",
    "InstanceNormalization",
    "GroupNormalization",
    "Softmax",
    "LogSoftmax",
)
# Operators kept in fp32 when casting to fp16/bf16: the block list is itself a search parameter.
BLOCK_LISTS: dict[str, tuple[str, ...]] = {
    "none": (),
    "norm_softmax": NORM_SOFTMAX,
    "sensitive": (
        *NORM_SOFTMAX,
        "ReduceMean",
        "ReduceSum",
        "ReduceL2",
        "ReduceLogSumExp",
        "ReduceSumSquare",
        "Exp",
        "Log",
        "Pow",
        "Sqrt",
        "Erf",
    ),
}

# Operators whose inputs fp8_static quantizes.
FP8_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


@dataclass(frozen=True)
class VariantOptions:
    """Which variant to make. Fields irrelevant to the precision are ignored (and normalised away)."""

    precision: str = "fp32"
    keep_fp32: str = "sensitive"  # fp16/bf16: a key of BLOCK_LISTS
    per_channel: bool = True  # int8/fp8 static
    calibration: str = "minmax"  # int8 static: minmax | percentile | entropy (fp8 always uses distribution)
    # Q/DQ as TensorRT's explicit quantization takes it: symmetric (zero points 0) and fp32 biases.
    tensorrt_qdq: bool = False

    def normalised(self) -> VariantOptions:
        """The same variant with irrelevant fields at fixed values (so equal variants hash equally)."""
        if self.precision in ("fp16", "bf16"):
            return VariantOptions(self.precision, self.keep_fp32, True, "minmax")
        if self.precision == "int8_static":
            return VariantOptions(self.precision, "none", self.per_channel, self.calibration, self.tensorrt_qdq)
        if self.precision == "fp8_static":
            return VariantOptions(self.precision, "none", False, "distribution", self.tensorrt_qdq)
        if self.precision == "int8_dynamic":
            return VariantOptions(self.precision, "none", self.per_channel, "minmax")
        return VariantOptions("fp32", "none", True, "minmax")


def make_variant(model: Path, options: VariantOptions, feeds: list[Feed], cache_dir: Path) -> Path:
    """The path of `model` converted per `options`, made under `cache_dir` unless already there."""
    opts = options.normalised()
    if opts.precision not in PRECISIONS:
        raise ValueError(f"unknown precision {opts.precision!r}; expected one of {PRECISIONS}")
    if opts.precision == "fp32":
        return model
    import onnxruntime

    key = hashlib.sha256(
        json.dumps(
            {
                "model": file_hash(model),
                "options": asdict(opts),
                "feeds": feeds_hash(feeds) if "static" in opts.precision else "",
                "recipe": RECIPE,
                "onnxruntime": onnxruntime.__version__,
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()[:24]
    cache_dir.mkdir(parents=True, exist_ok=True)
    out = cache_dir / f"{model.stem}.{opts.precision}.{key}.onnx"
    if out.exists():
        return out
    with atomic_path(out) as tmp:  # concurrent workers may both convert; either result is identical
        _CONVERTERS[opts.precision](model, tmp, opts, feeds)
        _finish(tmp)
    return out


def _finish(path: Path) -> None:
    """Repair the converter's output in place, then refuse it unless it is a valid, sorted ONNX graph."""
    import onnx

    from tuner.precision.graph import problems, repair

    m = repair(onnx.load(str(path)))
    found = problems(m)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ValueError(f"the converter's graph is invalid: {found[0]}{more}")
    onnx.save(m, str(path))
    onnx.checker.check_model(str(path))


def _cast(model: Path, out: Path, opts: VariantOptions, feeds: list[Feed]) -> None:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    m = onnx.load(str(model))
    block = list(BLOCK_LISTS[opts.keep_fp32])
    converted = convert_float_to_float16(m, keep_io_types=True, op_block_list=block or None, disable_shape_infer=False)
    if opts.precision == "bf16":
        converted = _fp16_to_bf16(converted)
    onnx.save(converted, str(out))  # `_finish` sorts it: the converter appends Cast nodes out of order


def _fp16_to_bf16(model: object) -> object:
    """Rewrite an fp16-cast model to bf16 (the graph and its subgraphs)."""
    _graph_to_bf16(model.graph)  # type: ignore[attr-defined]
    return model


def _graph_to_bf16(graph: object) -> None:
    """Every fp16 in `graph` becomes bf16: Cast targets, initializers, tensor attributes (Constant,
    ConstantOfShape values), value infos, and the same inside subgraphs."""
    import onnx

    fp16 = onnx.TensorProto.FLOAT16
    for node in graph.node:  # type: ignore[attr-defined]
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == fp16:
                attr.i = onnx.TensorProto.BFLOAT16
            for t in [attr.t] * attr.HasField("t") + list(attr.tensors):
                if t.data_type == fp16:
                    t.CopyFrom(_bf16_tensor(t))
            for sub in [attr.g] * attr.HasField("g") + list(attr.graphs):
                _graph_to_bf16(sub)
    for init in graph.initializer:  # type: ignore[attr-defined]
        if init.data_type == fp16:
            init.CopyFrom(_bf16_tensor(init))
    for vi in list(graph.value_info) + list(graph.output) + list(graph.input):  # type: ignore[attr-defined]
        if vi.type.tensor_type.elem_type == fp16:
            vi.type.tensor_type.elem_type = onnx.TensorProto.BFLOAT16


def _bf16_tensor(tensor: object) -> object:
    """An fp16 TensorProto as bf16 (round to nearest even), same name and shape."""
    import onnx
    from onnx import numpy_helper

    values = np.ascontiguousarray(numpy_helper.to_array(tensor).astype(np.float32))
    bits = values.view(np.uint32).astype(np.uint64)
    bf16 = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return onnx.helper.make_tensor(tensor.name, onnx.TensorProto.BFLOAT16, values.shape, bf16.tobytes(), raw=True)  # type: ignore[attr-defined]


def _dynamic(model: Path, out: Path, opts: VariantOptions, feeds: list[Feed]) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(model),
        str(out),
        weight_type=QuantType.QInt8,
        per_channel=opts.per_channel,
        extra_options={"DefaultTensorType": _float_type()},
    )


def _static(model: Path, out: Path, opts: VariantOptions, feeds: list[Feed]) -> None:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it: Iterator[Feed] = iter(feeds)

        def get_next(self) -> Feed | None:
            return next(self._it, None)

        def rewind(self) -> None:
            self._it = iter(feeds)

    method = {
        "minmax": CalibrationMethod.MinMax,
        "percentile": CalibrationMethod.Percentile,
        "entropy": CalibrationMethod.Entropy,
        "distribution": CalibrationMethod.Distribution,
    }[opts.calibration]
    fp8 = opts.precision == "fp8_static"
    qtype = QuantType.QFLOAT8E4M3FN if fp8 else QuantType.QInt8
    # fp8: Q/DQ only where the compute is (as TensorRT runs fp8). ONNX Runtime derives fp8 scales from a
    # tensor's spread, which is zero for constants (a zero bias, a Pad value, a scalar factor: scale 0),
    # and it gives Softmax outputs a bare [0, 1] range with no distribution at all.
    ops = list(FP8_OPS) if fp8 else None
    with tempfile.TemporaryDirectory() as tmp:
        prep = Path(tmp) / "prep.onnx"
        try:
            quant_pre_process(str(model), str(prep), skip_symbolic_shape=True)
        except Exception:  # pre-processing is an optimisation; quantize the original if it fails
            prep = model
        quantize_static(
            str(prep),
            str(out),
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=opts.per_channel and not fp8,
            activation_type=qtype,
            weight_type=qtype,
            calibrate_method=method,
            op_types_to_quantize=ops,
            extra_options={
                "DefaultTensorType": _float_type(),
                "ActivationSymmetric": fp8 or opts.tensorrt_qdq,
                "WeightSymmetric": True,
                "QuantizeBias": not opts.tensorrt_qdq,
            },
        )


def _float_type() -> int:
    import onnx

    return onnx.TensorProto.FLOAT


_CONVERTERS = {
    "fp16": _cast,
    "bf16": _cast,
    "int8_dynamic": _dynamic,
    "int8_static": _static,
    "fp8_static": _static,
}
