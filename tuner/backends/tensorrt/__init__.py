"""TensorRT backend: enterprise TensorRT 10.x/11.x (GPT build routes on 11.1+) and TensorRT-RTX 1.x.

"Building" a route makes the precision variant, parses it, configures the builder (and the GPT route)
and serializes the engine (`engine.plan`); "running" deserializes it after checking its sha256 and
times `execute_async_v3` with CUDA events. TensorRT is imported lazily: on a machine without it every
method that needs it raises TunerError with one clear line.
"""

from __future__ import annotations

from typing import Any

from tuner.backends.base import Artifact, Backend, BuildContext, Deployment, ExportRequest, ModelInfo, Runner
from tuner.backends.tensorrt.options import CUDA_GRAPH, OPTIONS
from tuner.space import Route, SearchSpace


class TensorRTBackend(Backend):
    """Routes over TensorRT's builder knobs, ONNX precision variants and GPT compiler knobs."""

    name = "tensorrt"
    options = OPTIONS

    def version(self) -> str:
        from tuner.backends.tensorrt.version import load_trt

        return load_trt().label

    def device(self) -> dict[str, Any]:
        from tuner.backends.tensorrt.gpu import gpu_fingerprint
        from tuner.backends.tensorrt.version import load_trt

        return {**gpu_fingerprint(), "trt": load_trt().label}

    def space(self, model: ModelInfo) -> SearchSpace:
        from tuner.backends.tensorrt.probe import knob_database
        from tuner.backends.tensorrt.space import trt_space
        from tuner.backends.tensorrt.version import load_trt
        from tuner.precision.given import given_precision

        api = load_trt()
        return trt_space(api.features, model, knob_database(api), given_precision(model.path))

    def study_attrs(self, model: ModelInfo) -> dict[str, Any]:
        """Recorded with a new study: the TensorRT module and its GPT knob database's version and default route."""
        from tuner.backends.tensorrt.gpt import study_attrs
        from tuner.backends.tensorrt.probe import knob_database
        from tuner.backends.tensorrt.version import load_trt

        api = load_trt()
        return {"trt": api.label, **study_attrs(knob_database(api))}

    def capabilities(self) -> dict[str, Any]:
        """For `tuner probe`: GPT knob database and whether engines built here also run here (a child process)."""
        from tuner.backends.tensorrt.gpt import parse_knob_database
        from tuner.backends.tensorrt.probe import probe

        found = probe(runtime=True)
        db = parse_knob_database(found["all_build_routes"])
        runtime = found["runtime"]
        return {
            "gpt": f"{len(db.knobs)} knobs (tuner {db.tuner_version})"
            if db.knobs
            else "not available (all_build_routes is empty)",
            "runtime": "engines built here run here" if runtime["runs"] else f"refused: {runtime['reason']}",
        }

    def build(self, route: Route, ctx: BuildContext) -> Artifact:
        from tuner.backends.tensorrt.build import build
        from tuner.backends.tensorrt.cuda import device_facts
        from tuner.backends.tensorrt.version import load_trt

        return build(load_trt(), route, ctx, device_facts())

    def deployment(self, request: ExportRequest) -> Deployment:
        """engine.plan, the ONNX it was built from, its timing cache, trtexec.sh and build_engine.py (needs no TensorRT
        here)."""
        from tuner.backends.tensorrt.export import deployment

        return deployment(request)

    def load(self, artifact: Artifact, route: Route, ctx: BuildContext) -> Runner:
        from tuner.backends.tensorrt.run import TrtRunner
        from tuner.backends.tensorrt.version import load_trt

        return TrtRunner(load_trt(), artifact, bool(CUDA_GRAPH.get(ctx.model.options)))
