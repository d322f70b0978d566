"""Re-measure a trial's stored artifact instead of rebuilding it (for confirmation rounds).

The trial child always calls `backend.build`; confirmation runs it with this wrapper as the backend
(`tuner.study.reuse:StoredArtifactBackend`) and names the real backend and the kept artifact in the
child's environment. `build` hands back the stored file when it is present with the recorded hash
(else it really builds), and `load` rebuilds once when the real backend cannot load the stored file
(e.g. an engine built for another device), so every round measures a working engine of the route.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tuner.backends import get_backend
from tuner.backends.base import Artifact, Backend, BuildContext, Deployment, ExportRequest, ModelInfo, Runner
from tuner.measure.inputs import file_hash
from tuner.space import Route, SearchSpace

REUSE_ENV = "TUNER_REUSE_ARTIFACT"
WRAPPER = "tuner.study.reuse:StoredArtifactBackend"


def reuse_env(backend: str, artifact: Path | None, sha256: str | None) -> dict[str, str]:
    """The child environment that makes `WRAPPER` stand for `backend` with the stored `artifact`."""
    return {REUSE_ENV: json.dumps({"backend": backend, "path": str(artifact) if artifact else None, "sha256": sha256})}


class StoredArtifactBackend(Backend):
    """The backend named in $TUNER_REUSE_ARTIFACT, reusing the artifact named there when it can."""

    def __init__(self, inner: Backend | None = None, stored: Path | None = None, sha256: str | None = None) -> None:
        """From $TUNER_REUSE_ARTIFACT (in a child), or around `inner` with the `stored` artifact given (in-process)."""
        if inner is None:
            config: dict[str, Any] = json.loads(os.environ[REUSE_ENV])
            inner, sha256 = get_backend(config["backend"]), config.get("sha256")
            stored = Path(config["path"]) if config.get("path") else None
        self.inner = inner
        self.name = self.inner.name
        self.stored = stored
        self.sha256 = sha256

    def version(self) -> str:
        return self.inner.version()

    def device(self) -> dict[str, Any]:
        return self.inner.device()

    def space(self, model: ModelInfo) -> SearchSpace:
        return self.inner.space(model)

    def build(self, route: Route, ctx: BuildContext) -> Artifact:
        """The stored artifact if it is intact, else a fresh build."""
        if self.stored is not None and self.stored.is_file() and file_hash(self.stored) == self.sha256:
            ctx.log(f"reusing stored artifact {self.stored.name}")
            return Artifact(self.stored, 0.0, {"reused": True})
        ctx.log("stored artifact missing or changed; rebuilding")
        return self.inner.build(route, ctx)

    def load(self, artifact: Artifact, route: Route, ctx: BuildContext) -> Runner:
        """Load it; a reused artifact that this machine cannot load is rebuilt once."""
        try:
            return self.inner.load(artifact, route, ctx)
        except Exception as exc:  # backends raise their own types for foreign or stale engines
            if not artifact.info.get("reused"):
                raise
            ctx.log(f"stored artifact does not load here ({type(exc).__name__}: {exc}); rebuilding")
            return self.inner.load(self.inner.build(route, ctx), route, ctx)

    def deployment(self, request: ExportRequest) -> Deployment:
        return self.inner.deployment(request)
