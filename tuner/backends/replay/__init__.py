"""Replay backend: answers trials from a recorded landscape instead of building anything.

`backend.options.landscape` names the landscape file (see `landscape.py`; recorded by
`bench/landscape/record.py`); a relative path is taken from the model file's directory. The study must
use the recording's model and validation data: accuracy is computed for real from the recorded
outputs against the study's reference. Timing is the real paired measurement on a virtual clock
(`run.py`), so a replayed trial takes milliseconds; `backend.options.drift_share` sets how much of the
recording's between-round drift a measurement carries (`run.py` says how).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from tuner.backends.base import Artifact, Backend, BuildContext, Deployment, ExportRequest, ModelInfo, Option, Runner
from tuner.backends.device import cpu_fingerprint
from tuner.backends.replay.landscape import Landscape, load_landscape
from tuner.errors import TunerError
from tuner.space import Route, SearchSpace

LANDSCAPE = Option(
    "landscape", str, "", "the recorded landscape file (a relative path is taken from the model file's directory)"
)
DRIFT_SHARE = Option(
    "drift_share",
    float,
    1.0,
    "share of the recorded between-round drift a replayed measurement carries (1: as recorded)",
    check=lambda v: None if 0.0 <= v <= 1.0 else "expected a number from 0 to 1",
)
SEED = Option("seed", int, 0, "seed mixed into the replayed noise (with each trial's folder, route and use)")


def landscape_of(model: ModelInfo) -> Landscape:
    """The landscape named by the study's backend options, checked against the study's model."""
    name = LANDSCAPE.get(model.options)
    if not isinstance(name, str) or not name:
        raise TunerError('the replay backend needs backend.options.landscape = "path/to/landscape.json.gz"')
    path = Path(name) if Path(name).is_absolute() else Path(model.path).parent / name
    landscape = load_landscape(path)
    recorded = landscape.meta["model"]["sha256"]
    if _model_sha(Path(model.path)) != recorded:
        raise TunerError(
            f"landscape {path.name} was recorded for another model (sha256 {recorded[:12]}...); use that model file"
        )
    return landscape


def _model_sha(path: Path) -> str:
    stat = path.stat()
    return _hash(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@cache
def _hash(path: str, mtime_ns: int, size: int) -> str:
    from tuner.measure.inputs import file_hash

    return file_hash(Path(path))


class ReplayBackend(Backend):
    """Routes, outcomes, outputs and latencies as recorded by a real backend.

    Given a `landscape`, it answers from that one (already loaded, e.g. by the search benchmark)
    instead of the file named in the study's options, checks no model file, and runs in its caller's
    process: a recorded death of the child is raised as `build.ChildDeath` instead of re-enacted.
    """

    name = "replay"
    options = (LANDSCAPE, DRIFT_SHARE, SEED)

    def __init__(self, landscape: Landscape | None = None) -> None:
        self.landscape = landscape

    def _landscape(self, model: ModelInfo) -> Landscape:
        return self.landscape if self.landscape is not None else landscape_of(model)

    def fork_safe(self, route: Route, options: Mapping[str, Any]) -> bool:
        """Replayed engines touch no device."""
        return True

    def version(self) -> str:
        from tuner.version import __version__

        return f"replay-{__version__}"

    def device(self) -> dict[str, Any]:
        return {**cpu_fingerprint(), "replay": True}

    def space(self, model: ModelInfo) -> SearchSpace:
        from tuner.backends.replay.space import replay_space

        return replay_space(self._landscape(model))

    def seed_routes(self, model: ModelInfo) -> list[Route]:
        """The recorded backend's recommended routes: as recorded, else ONNX Runtime's recipe for an ONNX Runtime
        recording."""
        landscape = self._landscape(model)
        if "seed_routes" in landscape.meta:
            return [dict(r) for r in landscape.meta["seed_routes"]]
        space = self.space(model)
        if landscape.meta["backend"].get("name") == "onnxruntime" and "int8_static" in space.param("precision").choices:
            from tuner.backends.onnxruntime.space import recommended_route

            return [recommended_route(space)]
        return []

    def study_attrs(self, model: ModelInfo) -> dict[str, Any]:
        """Where the replayed numbers come from, shown with the study in the dashboard."""
        meta = self._landscape(model).meta
        return {
            "landscape": str(LANDSCAPE.get(model.options)),
            "landscape_backend": meta["backend"],
            "landscape_environment": meta["environment"],
        }

    def build(self, route: Route, ctx: BuildContext) -> Artifact:
        from tuner.backends.replay.build import build

        return build(self._landscape(ctx.model), route, ctx, self.landscape is not None)

    def deployment(self, request: ExportRequest) -> Deployment:
        """Nothing native: a replayed trial built no engine; its numbers come from the recorded landscape."""
        meta = landscape_of(request.model).meta
        return Deployment(
            artifact_name=f"replay{request.artifact.suffix}",
            notes=[
                "A replayed trial: no engine was built. Its numbers come from the landscape "
                f"{LANDSCAPE.get(request.model.options)}, recorded with the {meta['backend']} backend; rebuild the "
                "route with that backend (route.json) to deploy it."
            ],
        )

    def load(self, artifact: Artifact, route: Route, ctx: BuildContext) -> Runner:
        from tuner.backends.replay.build import fail_if, read_round, trial_rng
        from tuner.backends.replay.run import ReplayRunner

        landscape = self._landscape(ctx.model)
        point = landscape.point(route)
        assert point is not None  # build() refused routes outside the landscape
        index = read_round(artifact)
        in_process = self.landscape is not None
        fail_if(point.rounds[index], "load", ctx.deadline_s, in_process)
        return ReplayRunner(
            landscape,
            point,
            index,
            trial_rng(ctx, point, 1),
            ctx.deadline_s,
            float(DRIFT_SHARE.get(ctx.model.options)),
            in_process,
        )
