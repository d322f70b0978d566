"""Run an ONNX Runtime artifact in the session its route is timed with (`session.session_settings`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tuner.backends.base import Artifact, Feed, Runner
from tuner.backends.onnxruntime.session import AS_IS, marked_level, session_settings
from tuner.backends.onnxruntime.standalone import open_session
from tuner.space import Route


class OrtRunner(Runner):
    """An InferenceSession over the artifact at the graph optimisation level it asks for (off when optimised
    offline)."""

    def __init__(self, artifact: Artifact, route: Route) -> None:
        self.settings: dict[str, Any] = session_settings(route, AS_IS)
        self.session = open_session(artifact.path, self.settings)
        level = marked_level(self.session)
        if level != AS_IS:  # a variant whose offline-optimised file did not load: optimised now, as it was timed
            del self.session
            self.settings = session_settings(route, level)
            self.session = open_session(artifact.path, self.settings)
        self.outputs = [o.name for o in self.session.get_outputs()]

    def infer(self, feed: Feed) -> dict[str, np.ndarray]:
        return dict(zip(self.outputs, self.session.run(self.outputs, feed)))

    def release(self) -> None:
        del self.session
