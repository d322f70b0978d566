"""Answer a replay build from the landscape: pick a recorded round, re-enact its failure or write a stub artifact."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import time

import numpy as np

from tuner import job as J
from tuner.backends.base import Artifact, BuildContext, BuildError, RuntimeRefused
from tuner.backends.replay.landscape import Landscape, Point, Round
from tuner.space import Route

ARTIFACT = "engine.replay.json"


def trial_rng(ctx: BuildContext, point: Point, stream: int) -> np.random.Generator:
    """A generator seeded per trial (its private out_dir within the work dir), route, use and the `seed`
    option: trials differ, reruns repeat."""
    out, work = ctx.out_dir.resolve(), ctx.work_dir.resolve()
    where = out.relative_to(work) if out.is_relative_to(work) else out
    seed = hashlib.sha256(f"{ctx.model.options.get('seed', 0)}|{where}|{point.key}|{stream}".encode()).digest()[:8]
    return np.random.default_rng(int.from_bytes(seed, "little"))


class ChildDeath(BaseException):
    """A recorded death of the trial's child (timeout, crash signal or exit), raised instead of dying when the
    trial runs in the caller's process: the caller records it as the worker records such a child."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def build(landscape: Landscape, route: Route, ctx: BuildContext, in_process: bool = False) -> Artifact:
    """Choose one recorded round of `route` at random and build like it did."""
    point = landscape.point(route)
    if point is None:
        raise BuildError("route not in the landscape")
    if not point.rounds:
        raise BuildError(f"the landscape has no measurement of this route ({point.invalid or 'never built'})")
    index = int(trial_rng(ctx, point, 0).integers(len(point.rounds)))
    rnd = point.rounds[index]
    fail_if(rnd, "build", ctx.deadline_s, in_process)
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    out = ctx.out_dir / ARTIFACT
    out.write_text(json.dumps({"route": point.key, "round": index, "recorded_build_s": rnd.build_s}))
    return Artifact(out, float(rnd.build_s or 0.0), {"replay_round": index})


def read_round(artifact: Artifact) -> int:
    """The round a replay artifact stands for."""
    return int(json.loads(artifact.path.read_text())["round"])


def fail_if(rnd: Round, phase: str, deadline_s: float | None, in_process: bool = False) -> None:
    """Re-enact the round's failure if it failed in `phase` ("run": in any phase after loading)."""
    if rnd.status != J.OK and (rnd.phase == phase or (phase == "run" and rnd.phase not in ("build", "load"))):
        reenact(rnd, deadline_s, in_process)


def reenact(rnd: Round, deadline_s: float | None, in_process: bool = False) -> None:
    """Fail the way the recorded round failed; called in the phase it failed in. `in_process`: a death of
    the child (timeout, crash) is raised as `ChildDeath` instead of ending this process."""
    if in_process and rnd.status in (J.TIMEOUT, J.CRASH_SIGNAL, J.CRASH_EXIT):
        raise ChildDeath(rnd.status, rnd.message or rnd.status)
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
