"""The ONNX Runtime route space: session options, precision variants, transformer fusions."""

from __future__ import annotations

import os

from tuner.backends.base import ModelInfo
from tuner.space import Param, SearchSpace

# ONNX Runtime transformer-optimizer fusion switches (FusionOptions attributes) offered as knobs.
FUSIONS = {
    "fuse_attention": "enable_attention",
    "fuse_skip_layer_norm": "enable_skip_layer_norm",
    "fuse_embed_layer_norm": "enable_embed_layer_norm",
    "fuse_gelu": "enable_gelu",
    "fuse_bias_gelu": "enable_bias_gelu",
    "fuse_layer_norm": "enable_layer_norm",
}


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
    params: list[Param] = [
        Param("provider", providers, providers[0], "execution provider"),
        Param("precision", ("fp32", "fp16", "int8_dynamic", "int8_static"), "fp32", "precision variant of the ONNX graph"),
        Param("keep_fp32", ("sensitive", "norm_softmax", "none"), "sensitive", "ops kept in fp32 in an fp16 graph",
              when=lambda r: r["precision"] == "fp16"),
        Param("per_channel", (True, False), True, "per-channel int8 weight scales",
              when=lambda r: str(r["precision"]).startswith("int8")),
        Param("calibration", ("minmax", "percentile"), "minmax", "int8 calibration method",
              when=lambda r: r["precision"] == "int8_static"),
    ]
    if model.options.get("model_type"):
        params.append(Param("transformer_fusion", (False, True), False, "run ONNX Runtime's transformer optimizer"))
        params.extend(
            Param(name, (True, False), True, f"transformer optimizer switch {attr}", when=lambda r: bool(r.get("transformer_fusion")))
            for name, attr in FUSIONS.items()
        )
    params += [
        Param("graph_optimization_level", ("all", "extended", "basic", "disabled"), "all", "ORT graph optimisation level"),
        Param("execution_mode", ("sequential", "parallel"), "sequential", "ORT execution mode"),
        Param("intra_op_threads", _threads(), 0, "intra-op threads (0: ORT decides)"),
        Param("inter_op_threads", (0, 1, 2), 0, "inter-op threads (parallel mode)", when=lambda r: r["execution_mode"] == "parallel"),
        Param("cpu_mem_arena", (True, False), True, "CPU memory arena"),
        Param("mem_pattern", (True, False), True, "memory pattern planning"),
    ]
    return SearchSpace(tuple(params), invalid=_invalid)


def _invalid(route: dict) -> str | None:
    if route.get("provider") == "cuda" and route.get("precision") == "int8_dynamic":
        return "dynamic int8 (ConvInteger/MatMulInteger) has no CUDA kernels"
    return None
