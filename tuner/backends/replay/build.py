"""Answer a replay build from the landscape: pick a recorded round, re-enact its failure or write a stub artifact."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import time

import numpy as np

from tuner.backends.base import Artifact, BuildContext, BuildError, RuntimeRefused
from tuner.backends.replay.landscape import Landscape, Point, Round
from tuner.space import Route
from tuner import job as J

ARTIFACT = "engine.replay.json"


def trial_rng(ctx: BuildContext, point: Point, stream: int) -> np.random.Generator:
    """A generator seeded per trial (its private out_dir), route and use: trials differ, reruns repeat."""
    seed = hashlib.sha256(f"{ctx.out_dir.resolve()}|{point.key}|{stream}".encode()).digest()[:8]
    return np.random.default_rng(int.from_bytes(seed, "little"))


def build(landscape: Landscape, route: Route, ctx: BuildContext) -> Artifact:
    """Choose one recorded round of `route` at random and build like it did."""
    point = landscape.point(route)
    if point is None:
        raise BuildError("route not in the landscape")
    if not point.rounds:
        raise BuildError(f"the landscape has no measurement of this route ({point.invalid or 'never built'})")
    index = int(trial_rng(ctx, point, 0).integers(len(point.rounds)))
    rnd = point.rounds[index]
    fail_if(rnd, "build", ctx.deadline_s)
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    out = ctx.out_dir / ARTIFACT
    out.write_text(json.dumps({"route": point.key, "round": index, "recorded_build_s": rnd.build_s}))
    return Artifact(out, float(rnd.build_s or 0.0), {"replay_round": index})


def read_round(artifact: Artifact) -> int:
    """The round a replay artifact stands for."""
    return int(json.loads(artifact.path.read_text())["round"])


def fail_if(rnd: Round, phase: str, deadline_s: float | None) -> None:
    """Re-enact the round's failure if it failed in `phase` ("run": in any phase after loading)."""
    if rnd.status != J.OK and (rnd.phase == phase or (phase == "run" and rnd.phase not in ("build", "load"))):
        reenact(rnd, deadline_s)


def reenact(rnd: Round, deadline_s: float | None) -> None:
    """Fail the way the recorded round failed; called in the phase it failed in."""
    if rnd.status == J.BUILD_ERROR:
        raise BuildError(rnd.message)
    if rnd.status == J.RUNTIME_UNSUPPORTED:
        raise RuntimeRefused(rnd.message)
    if rnd.status == J.TIMEOUT:  # outlive the deadline: the worker kills this child, as it did the recorded one
        time.sleep(max(0.0, (deadline_s or time.monotonic()) - time.monotonic()) + 3600.0)
    if rnd.status == J.CRASH_SIGNAL:
        os.kill(os.getpid(), _signal_of(rnd.message))
    if rnd.status == J.CRASH_EXIT:
        os._exit(1)
    raise RuntimeError(rnd.message or rnd.status)


def _signal_of(message: str) -> int:
    match = re.search(r"\b(SIG[A-Z0-9]+)\b", message)
    return int(getattr(signal, match.group(1), signal.SIGSEGV)) if match else int(signal.SIGSEGV)
