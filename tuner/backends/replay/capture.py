"""Recording side of replay: a wrapper around a real backend that keeps the engine's outputs per feed.

The landscape recorder runs each route through the normal isolated child with this wrapper as the
job's backend (`tuner.backends.replay.capture:CaptureBackend`) and the real backend's name in
`options["capture_backend"]`. Build, load and timing are the real backend's; the wrapper only writes
what `infer` returned to `work_dir/captured/<route hash>.npz` (`captured_path`) when the child closes
the runner, so the outputs outlive the trial's out dir. A whole study can run on the wrapper too (the
study file names it as its backend; its options are the real backend's plus `capture_backend`), which
is how a GPU landscape is recorded by many workers at once (bench/gpu/landscape_study.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from tuner.backends import get_backend
from tuner.backends.base import Artifact, Backend, BuildContext, Deployment, ExportRequest, Feed, ModelInfo, Runner
from tuner.backends.replay.landscape import Outputs, feed_key
from tuner.measure.inputs import read_groups, save_groups
from tuner.space import Route, SearchSpace, route_hash

OPTION = "capture_backend"


def captured_path(work_dir: Path, route: Route) -> Path:
    """Where the outputs of `route`'s engine are kept."""
    return Path(work_dir) / "captured" / f"{route_hash(route)}.npz"


def _inner(model: ModelInfo) -> tuple[Backend, ModelInfo]:
    options = dict(model.options)
    backend = get_backend(str(options.pop(OPTION)))
    return backend, replace(model, options=options)


class CaptureBackend(Backend):
    """Delegates everything to `options["capture_backend"]`; its runner records outputs."""

    name = "capture"

    def option_problem(self, options: Mapping[str, Any]) -> tuple[str, str] | None:
        """`capture_backend` names a backend; the other options are that backend's to check."""
        inner = options.get(OPTION)
        if not isinstance(inner, str) or not inner:
            return OPTION, "expected the name of the backend to record"
        rest = {k: v for k, v in options.items() if k != OPTION}
        return get_backend(inner).option_problem(rest)

    def version(self) -> str:
        return "capture"

    def device(self) -> dict[str, Any]:
        return {}

    def space(self, model: ModelInfo) -> SearchSpace:
        backend, inner = _inner(model)
        return backend.space(inner)

    def build(self, route: Route, ctx: BuildContext) -> Artifact:
        backend, inner = _inner(ctx.model)
        return backend.build(route, replace(ctx, model=inner))

    def deployment(self, request: ExportRequest) -> Deployment:
        backend, inner = _inner(request.model)
        return backend.deployment(replace(request, model=inner))

    def load(self, artifact: Artifact, route: Route, ctx: BuildContext) -> Runner:
        backend, inner = _inner(ctx.model)
        return CapturingRunner(
            backend.load(artifact, route, replace(ctx, model=inner)), captured_path(ctx.work_dir, route)
        )


class CapturingRunner(Runner):
    """The real runner (owned: closed with this one), plus a record of every distinct feed's outputs, saved on close."""

    owns_inner = True

    def __init__(self, runner: Runner, path: Path) -> None:
        self.runner = runner
        self.path = path
        self.seen: dict[str, Outputs] = {}

    def infer(self, feed: Feed) -> dict[str, np.ndarray]:
        out = self.runner.infer(feed)
        self.seen.setdefault(feed_key(feed), {k: np.array(v, copy=True) for k, v in out.items()})
        return out

    def timed(self, feed: Feed) -> Callable[[], float]:
        return self.runner.timed(feed)

    def timing_info(self) -> dict[str, Any]:
        return self.runner.timing_info()

    def release(self) -> None:
        if self.seen:  # a runner only timed (a paired trial's baseline) has nothing to keep
            save_groups(self.path, self.seen)
        self.runner.close()


def read_captured(path: Path) -> dict[str, Outputs]:
    """The outputs saved by a CapturingRunner, keyed by feed_key."""
    return dict(read_groups(path))
