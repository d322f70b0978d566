"""Recording side of replay: a wrapper around a real backend that keeps the engine's outputs per feed.

The landscape recorder runs each route through the normal isolated child with this wrapper as the
job's backend (`tuner.backends.replay.capture:CaptureBackend`) and the real backend's name in
`options["capture_backend"]`. Build, load and timing are the real backend's; the wrapper only writes
what `infer` returned to `out_dir/outputs.npz` when the child closes the runner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from tuner.backends import get_backend
from tuner.backends.base import Artifact, Backend, BuildContext, Feed, ModelInfo, Runner
from tuner.backends.replay.landscape import Outputs, feed_key
from tuner.space import Route, SearchSpace

OPTION = "capture_backend"
OUTPUTS = "outputs.npz"


def _inner(model: ModelInfo) -> tuple[Backend, ModelInfo]:
    options = dict(model.options)
    backend = get_backend(str(options.pop(OPTION)))
    return backend, replace(model, options=options)


class CaptureBackend(Backend):
    """Delegates everything to `options["capture_backend"]`; its runner records outputs."""

    name = "capture"

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

    def load(self, artifact: Artifact, route: Route, ctx: BuildContext) -> Runner:
        backend, inner = _inner(ctx.model)
        return CapturingRunner(backend.load(artifact, route, replace(ctx, model=inner)), ctx.out_dir / OUTPUTS)


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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(self.path, **{f"{key}/{name}": a for key, out in self.seen.items() for name, a in out.items()})
        self.runner.close()


def read_captured(path: Path) -> dict[str, Outputs]:
    """The outputs saved by a CapturingRunner, keyed by feed_key."""
    out: dict[str, Outputs] = {}
    with np.load(path, allow_pickle=False) as npz:
        for key in npz.files:
            feed, _, name = key.partition("/")
            out.setdefault(feed, {})[name] = npz[key]
    return out
