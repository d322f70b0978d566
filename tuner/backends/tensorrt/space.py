"""The TensorRT route space per version (tensorrt.md §7): builder knobs, precision variants, GPT knobs.

11.x and TensorRT-RTX are strongly typed: precision is the choice of ONNX variant file. 10.x also
offers the (deprecated) weak-typing builder flags. On 11.1+ enterprise TensorRT the GPT knobs of the
installed knob database are appended as `knob:<option>` parameters.
"""

from __future__ import annotations

from tuner.backends.base import ModelInfo
from tuner.backends.tensorrt.gpt import KnobDatabase, knob_params
from tuner.backends.tensorrt.version import Features
from tuner.precision.given import AS_GIVEN, GivenPrecision
from tuner.space import Param, SearchSpace

PRECISIONS = ("fp32", "fp16", "bf16", "int8_static", "fp8_static")
TILING = ("NONE", "FAST", "MODERATE", "FULL")
# Tactic-source parameters -> TacticSource member names; the legacy ones exist on 10.x only.
TACTICS = {"tactic_edge_mask": "EDGE_MASK_CONVOLUTIONS", "tactic_jit": "JIT_CONVOLUTIONS"}
LEGACY_TACTICS = {"tactic_cublas": "CUBLAS", "tactic_cublas_lt": "CUBLAS_LT", "tactic_cudnn": "CUDNN"}
FP32 = GivenPrecision(AS_GIVEN)
UNSET = -1  # "leave TensorRT's own default/heuristic" for integer knobs


def trt_space(features: Features, model: ModelInfo, knobs: KnobDatabase, given: GivenPrecision = FP32) -> SearchSpace:
    """The space TensorRT `features` offers for `model`, with the GPT knobs of `knobs` (`given`: the model's
    precision)."""
    params = _precision(features, given) + _builder(features) + _tactics(features)
    if features.gpt_api:
        params += knob_params(knobs, model.options)
    return SearchSpace(tuple(params))


def _precision(features: Features, given: GivenPrecision) -> list[Param]:
    params = [
        Param(
            "precision",
            given.applicable(PRECISIONS),
            AS_GIVEN,
            "ONNX variant the engine is built from (strong typing: the graph's types)",
            why=given.note,
        )
    ]
    if not given.reduced:  # a model that takes no variant has no variant knobs
        params.append(
            Param(
                "keep_fp32",
                ("sensitive", "norm_softmax", "none"),
                "sensitive",
                "ops kept in fp32 in an fp16/bf16 variant",
                when=lambda r: r["precision"] in ("fp16", "bf16"),
            )
        )
    if features.weak_typing:
        params.append(
            Param(
                "builder_precision",
                ("none", "fp16", "bf16", "fp16_obey"),
                "none",
                "10.x weak typing: 'none' builds a strongly typed network; otherwise the FP16/BF16 "
                "builder flags let TensorRT lower precision ('_obey': OBEY_PRECISION_CONSTRAINTS)",
            )
        )
    return params


def _builder(features: Features) -> list[Param]:
    params = [
        Param(
            "builder_optimization_level", (3, 2, 4, 5), 3, "builder optimization level (0-2 trade speed for build time)"
        )
    ]
    if features.tiling:
        params += [
            Param("tiling_optimization_level", TILING, "NONE", "tiling (on-chip caching) search level"),
            Param(
                "l2_limit_pct",
                (UNSET, 25, 50, 100),
                UNSET,
                "L2 bytes tiling may use, % of the device L2 (-1: TensorRT decides)",
                when=lambda r: r["tiling_optimization_level"] != "NONE",
            ),
        ]
    if features.max_num_tactics:
        params.append(Param("max_num_tactics", (UNSET, 16, 64, 256), UNSET, "tactics timed per layer (-1: heuristic)"))
    params += [
        Param("max_aux_streams", (UNSET, 0, 1, 2, 4), UNSET, "auxiliary streams (-1: heuristic; 0: one stream)"),
        Param(
            "workspace_log2",
            (UNSET, 28, 30, 32),
            UNSET,
            "workspace pool limit as log2 bytes, clamped to free memory (-1: device default)",
        ),
        Param("tf32", (True, False), True, "TF32 for fp32 tensors"),
        Param("sparse_weights", (False, True), False, "allow 2:4 structured-sparsity kernels"),
        Param(
            "avg_timing_iterations", (8, 1, 4, 16), 8, "timing iterations averaged per tactic (8: trtexec's default)"
        ),
    ]
    return params


def _tactics(features: Features) -> list[Param]:
    params = [Param(name, (True, False), True, f"tactic source {source}") for name, source in TACTICS.items()]
    if features.legacy_tactics:
        params += [
            Param(name, (False, True), False, f"tactic source {source} (deprecated, 10.x)")
            for name, source in LEGACY_TACTICS.items()
        ]
    return params
