"""The ONNX Runtime route space: session options, precision variants (int8 knobs: quant_space), transformer fusions."""

from __future__ import annotations

import os

from tuner.backends.base import ModelInfo
from tuner.backends.onnxruntime.products import FUSIONS
from tuner.backends.onnxruntime.quant_space import model_op_types, quant_params
from tuner.precision.given import AS_GIVEN, given_precision
from tuner.space import Param, SearchSpace

PRECISIONS = ("fp32", "fp16", "int8_dynamic", "int8_static")


def _threads() -> tuple[int, ...]:
    cores = os.cpu_count() or 1
    return tuple(sorted({0, 1, *[n for n in (2, 4, 8, 16, 32) if n <= cores], cores}))


def _providers() -> tuple[str, ...]:
    import onnxruntime

    available = onnxruntime.get_available_providers()
    return ("cuda", "cpu") if "CUDAExecutionProvider" in available else ("cpu",)


def ort_space(model: ModelInfo) -> SearchSpace:
    """The space for `model`; transformer fusions appear when `backend.options.model_type` is set."""
    providers = _providers()
    given = given_precision(model.path)  # an already quantized or fp16 model takes no further variant
    params: list[Param] = [
        Param("provider", providers, providers[0], "execution provider"),
        Param(
            "precision", given.applicable(PRECISIONS), AS_GIVEN, "precision variant of the ONNX graph", why=given.note
        ),
    ]
    if not given.reduced:  # the knobs of the variants (none for a model that takes no variant)
        params += [
            Param(
                "keep_fp32",
                ("sensitive", "norm_softmax", "none"),
                "sensitive",
                "ops kept in fp32 in an fp16 graph",
                when=lambda r: r["precision"] == "fp16",
            ),
            *quant_params(model_op_types(model.path)),
        ]
    if model.options.get("model_type"):
        params.append(Param("transformer_fusion", (False, True), False, "run ONNX Runtime's transformer optimizer"))
        params.extend(
            Param(
                name,
                (True, False),
                True,
                f"transformer optimizer switch {attr}",
                when=lambda r: bool(r.get("transformer_fusion")),
            )
            for name, attr in FUSIONS.items()
        )
    params += [
        Param(
            "graph_optimization_level",
            ("all", "extended", "basic", "disabled"),
            "all",
            "ORT graph optimisation level",
            when=lambda r: r["precision"] != "int8_static",
        ),
        Param("execution_mode", ("sequential", "parallel"), "sequential", "ORT execution mode"),
        Param("intra_op_threads", _threads(), 0, "intra-op threads (0: ORT decides)", threads=True),
        Param(
            "inter_op_threads",
            (0, 1, 2),
            0,
            "inter-op threads (parallel mode)",
            when=lambda r: r["execution_mode"] == "parallel",
            threads=True,
        ),
        Param("cpu_mem_arena", (True, False), True, "CPU memory arena"),
        Param("mem_pattern", (True, False), True, "memory pattern planning"),
    ]
    return SearchSpace(tuple(params), invalid=_invalid)


def _invalid(route: dict) -> str | None:
    if route.get("provider") == "cuda" and route.get("precision") == "int8_dynamic":
        return "dynamic int8 (ConvInteger/MatMulInteger) has no CUDA kernels"
    return None


def recommended_route(space: SearchSpace) -> dict:
    """ONNX Runtime's recommended int8 recipe for this CPU: static int8 with every knob at its default.

    The defaults are ORT's documented choices (`quant_space.recommendation`): U8S8 Q/DQ per-channel,
    MinMax calibration, `reduce_range` by VNNI, graph level `all`.
    """
    return space.complete({"precision": "int8_static"})
