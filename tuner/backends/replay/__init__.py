"""Replay backend: answers trials from a recorded landscape instead of building anything.

`backend.options.landscape` names the landscape file (see `landscape.py`; recorded by
`bench/landscape/record.py`); a relative path is taken from the model file's directory. The study must
use the recording's model and validation data: accuracy is computed for real from the recorded
outputs against the study's reference. Set `objective.min_duration_s = 0`: a replayed inference
takes no time, latencies are drawn from the recorded samples.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from tuner.backends.base import Artifact, Backend, BuildContext, ModelInfo, Option, Runner
from tuner.backends.device import cpu_fingerprint
from tuner.backends.replay.landscape import Landscape, load_landscape
from tuner.errors import TunerError
from tuner.space import Route, SearchSpace


LANDSCAPE = Option("landscape", str, "", "the recorded landscape file (a relative path is taken from the model file's directory)")


def landscape_of(model: ModelInfo) -> Landscape:
    """The landscape named by the study's backend options, checked against the study's model."""
    name = LANDSCAPE.get(model.options)
    if not isinstance(name, str) or not name:
        raise TunerError("the replay backend needs backend.options.landscape = \"path/to/landscape.json.gz\"")
    path = Path(name) if Path(name).is_absolute() else Path(model.path).parent / name
    landscape = load_landscape(path)
    recorded = landscape.meta["model"]["sha256"]
    if _model_sha(Path(model.path)) != recorded:
        raise TunerError(f"landscape {path.name} was recorded for another model (sha256 {recorded[:12]}...); use that model file")
    return landscape


def _model_sha(path: Path) -> str:
    stat = path.stat()
    return _hash(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@cache
def _hash(path: str, mtime_ns: int, size: int) -> str:
    from tuner.measure.inputs import file_hash

    return file_hash(Path(path))


class ReplayBackend(Backend):
    """Routes, outcomes, outputs and latencies as recorded by a real backend."""

    name = "replay"
    options = (LANDSCAPE,)

    def version(self) -> str:
        from tuner import __version__

        return f"replay-{__version__}"

    def device(self) -> dict[str, Any]:
        return {**cpu_fingerprint(), "replay": True}

    def space(self, model: ModelInfo) -> SearchSpace:
        from tuner.backends.replay.space import replay_space

        return replay_space(landscape_of(model))

    def study_attrs(self, model: ModelInfo) -> dict[str, Any]:
        """Where the replayed numbers come from, shown with the study in the dashboard."""
        meta = landscape_of(model).meta
        return {"landscape": str(LANDSCAPE.get(model.options)), "landscape_backend": meta["backend"],
                "landscape_environment": meta["environment"]}

    def build(self, route: Route, ctx: BuildContext) -> Artifact:
        from tuner.backends.replay.build import build

        return build(landscape_of(ctx.model), route, ctx)

    def load(self, artifact: Artifact, route: Route, ctx: BuildContext) -> Runner:
        from tuner.backends.replay.build import fail_if, read_round, trial_rng
        from tuner.backends.replay.run import ReplayRunner

        landscape = landscape_of(ctx.model)
        point = landscape.point(route)
        assert point is not None  # build() refused routes outside the landscape
        index = read_round(artifact)
        fail_if(point.rounds[index], "load", ctx.deadline_s)
        return ReplayRunner(landscape, point, index, trial_rng(ctx, point, 1), ctx.deadline_s)
