"""ONNX Runtime backend: CPU everywhere, the CUDA execution provider where onnxruntime-gpu is installed.

"Building" a route produces the optimised ONNX file that ONNX Runtime itself writes
(`SessionOptions.optimized_model_filepath`) from the precision variant, after the optional
transformer fusions and, for int8, the model preparation; "running" loads that file with the
route's session options. Int8 variants come from ONNX Runtime's own quantizer with its documented
recommendations for this CPU as defaults (`quant_space`), and ORT's recommended int8 recipe is
tried right after the default route.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tuner.backends.base import Artifact, Backend, BuildContext, Deployment, ExportRequest, ModelInfo, Option, Runner
from tuner.backends.device import cpu_fingerprint
from tuner.space import Route, SearchSpace


class OnnxRuntimeBackend(Backend):
    """Routes over ONNX Runtime's session options, precision variants and transformer fusions."""

    name = "onnxruntime"
    options = (
        Option(
            "model_type",
            str,
            "",
            'ONNX Runtime transformer-optimizer model type (e.g. "bert"); set, it offers the transformer fusions',
        ),
        Option("num_heads", int, 0, "attention heads, for the transformer optimizer (0: detect)"),
        Option("hidden_size", int, 0, "hidden size, for the transformer optimizer (0: detect)"),
    )
    preload = (
        "onnxruntime",
        "onnx",
        "tuner.backends.onnxruntime.build",
        "tuner.backends.onnxruntime.run",
        "tuner.study.reuse",
    )

    def fork_safe(self, route: Route, options: Mapping[str, Any]) -> bool:
        """CPU routes: importing ONNX Runtime initialises no device; the CUDA provider keeps a fresh process."""
        return route.get("provider", "cpu") == "cpu"

    def version(self) -> str:
        """ONNX Runtime's version and the session settings every timed session gets (part of the cache key)."""
        import onnxruntime

        from tuner.backends.onnxruntime.session import SESSION_CONFIG

        return " ".join(
            [onnxruntime.__version__, *(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in sorted(SESSION_CONFIG.items()))]
        )

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

    def deployment(self, request: ExportRequest) -> Deployment:
        """engine.onnx, session.json (the measured session by ONNX Runtime's names) and run_onnxruntime.py."""
        from tuner.backends.onnxruntime.export import deployment

        return deployment(request)

    def learned_failure(
        self, route: Route, model: ModelInfo, work_dir: Path, model_sha: str, data_sha: str
    ) -> tuple[str, str] | None:
        from tuner.backends.onnxruntime.products import FailureBook, products

        known = FailureBook(work_dir).lookup(products(route, model_sha, model.options, data_sha))
        return (known[0].key, f"{known[0].kind} {known[0].key}, which failed before: {known[1]}") if known else None

    def preparation(
        self, model: ModelInfo, space: SearchSpace, work_dir: Path, log: Callable[[str], None] = print
    ) -> list[dict[str, Any]]:
        if not any(str(c).startswith("int8") for c in space.param("precision").choices):
            return []  # only int8 variants are made from the prepared model
        from tuner.backends.onnxruntime.prepare import prepare
        from tuner.backends.onnxruntime.products import products
        from tuner.measure.inputs import file_hash

        prepared = next(
            p
            for p in products({"precision": "int8_static"}, file_hash(model.path), model.options, "")
            if p.kind == "prepared"
        )
        return prepare(model.path, prepared.key, work_dir / "variants", log).steps

    def seed_routes(self, model: ModelInfo) -> list[Route]:
        from tuner.backends.onnxruntime.space import recommended_route

        return [recommended_route(self.space(model))]
