"""Run an ONNX Runtime artifact with the route's session options."""

from __future__ import annotations

import numpy as np

from tuner.backends.base import Artifact, Feed, Runner
from tuner.backends.onnxruntime.build import PROVIDERS
from tuner.space import Route

# Every session the tuner times stops its thread pools spinning when a run ends (ONNX Runtime's default keeps
# them spinning for a while). With the candidate and the baseline in one timing process, the idle engine's
# spinning pool otherwise ran beside the timed one on the same cores (bench/ort_spinning.py). Part of every
# route, default included; `tuner build` and the exported winner's reproduction use it too.
SESSION_CONFIG = {"session.force_spinning_stop": "1"}


class OrtRunner(Runner):
    """An InferenceSession over the already-optimised artifact (graph optimisation off at load)."""

    def __init__(self, artifact: Artifact, route: Route) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.execution_mode = ort.ExecutionMode.ORT_PARALLEL if route["execution_mode"] == "parallel" else ort.ExecutionMode.ORT_SEQUENTIAL
        opts.intra_op_num_threads = int(route["intra_op_threads"])
        opts.inter_op_num_threads = int(route.get("inter_op_threads", 0))
        opts.enable_cpu_mem_arena = bool(route["cpu_mem_arena"])
        opts.enable_mem_pattern = bool(route["mem_pattern"])
        opts.log_severity_level = 3
        for key, value in SESSION_CONFIG.items():
            opts.add_session_config_entry(key, value)
        self.session = ort.InferenceSession(str(artifact.path), opts, providers=PROVIDERS[str(route["provider"])])
        self.outputs = [o.name for o in self.session.get_outputs()]

    def infer(self, feed: Feed) -> dict[str, np.ndarray]:
        return dict(zip(self.outputs, self.session.run(self.outputs, feed)))

    def release(self) -> None:
        del self.session
