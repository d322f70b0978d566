"""ONNX Runtime backend: CPU everywhere, the CUDA execution provider where onnxruntime-gpu is installed.

"Building" a route produces the optimised ONNX file that ONNX Runtime itself writes
(`SessionOptions.optimized_model_filepath`) from the precision variant, after the optional
transformer fusions; "running" loads that file with the route's session options.
"""

from __future__ import annotations

from typing import Any

from tuner.backends.base import Artifact, Backend, BuildContext, ModelInfo, Option, Runner
from tuner.backends.device import cpu_fingerprint
from tuner.space import Route, SearchSpace


class OnnxRuntimeBackend(Backend):
    """Routes over ONNX Runtime's session options, precision variants and transformer fusions."""

    name = "onnxruntime"
    options = (
        Option("model_type", str, "", "ONNX Runtime transformer-optimizer model type (e.g. \"bert\"); set, it offers the transformer fusions"),
        Option("num_heads", int, 0, "attention heads, for the transformer optimizer (0: detect)"),
        Option("hidden_size", int, 0, "hidden size, for the transformer optimizer (0: detect)"),
    )

    def version(self) -> str:
        import onnxruntime

        return onnxruntime.__version__

    def device(self) -> dict[str, Any]:
        import onnxruntime

        return {**cpu_fingerprint(), "providers": onnxruntime.get_available_providers()}

    def space(self, model: ModelInfo) -> SearchSpace:
        from tuner.backends.onnxruntime.space import ort_space

        return ort_space(model)

    def build(self, route: Route, ctx: BuildContext) -> Artifact:
        from tuner.backends.onnxruntime.build import build

        return build(route, ctx)

    def load(self, artifact: Artifact, route: Route, ctx: BuildContext) -> Runner:
        from tuner.backends.onnxruntime.run import OrtRunner

        return OrtRunner(artifact, route)
