"""Test backends loaded by name (`tests.backends:Class`) in study files.

They are the real ONNX Runtime backend with deliberate faults added around `build`, so crash
isolation, leases and the cache are exercised by real processes and real signals.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tuner.backends.base import Artifact, BuildContext, ModelInfo, Option
from tuner.backends.onnxruntime import OnnxRuntimeBackend
from tuner.space import Param, Route, SearchSpace
from tuner.worker.lifeline import STARTER_ENV


def _next_build(marker_dir: Path) -> int:
    """Count this build (atomically, across processes) and return its 0-based index."""
    marker_dir.mkdir(parents=True, exist_ok=True)
    n = 0
    while True:
        try:
            os.close(os.open(marker_dir / f"build-{n:04d}", os.O_CREAT | os.O_EXCL))
            return n
        except FileExistsError:
            n += 1


def _worker() -> int:
    """The pid of the worker that runs this child: its parent, or, for a child forked by the worker's server, the
    starter."""
    return int(os.environ.get(STARTER_ENV) or os.getppid())


def _block(marker_dir: Path, key: str) -> None:
    """Announce `blocked-<key>` (with the worker's pid) and wait for `release`, or for the worker to die."""
    parent = os.getppid()
    (marker_dir / f"blocked-{key}.tmp").write_text(str(_worker()))
    (marker_dir / f"blocked-{key}.tmp").replace(marker_dir / f"blocked-{key}")
    while not (marker_dir / "release").exists():
        if os.getppid() != parent:  # the worker was killed: this orphan must not linger
            os._exit(3)
        time.sleep(0.05)


def _announce(marker_dir: Path, name: str) -> None:
    """Write `name` (atomically) holding this process's pid and its worker's, space-separated."""
    (marker_dir / f"{name}.tmp").write_text(f"{os.getpid()} {_worker()}")
    (marker_dir / f"{name}.tmp").replace(marker_dir / name)


class FaultBackend(OnnxRuntimeBackend):
    """ONNX Runtime with scripted faults per build number.

    backend.options:
      marker_dir: where builds are counted (`build-NNNN` files) and blocks are announced;
      faults: a table {build index (as a string), or "default" (the first build of the default route: the
        baseline trial's, whichever worker's child builds first):
        "segfault" | "hang" | "block" | "error" |
        "errno-NAME" (an OSError with that errno, e.g. "errno-ENOSPC", "errno-EIO") |
        "orphan" (announce `orphan-<key>` with the pids, then hang without watching the worker) |
        "outside" (report an artifact outside the out dir)}.
    """

    name = "fault"
    options = (
        *OnnxRuntimeBackend.options,
        Option("marker_dir", str, "", "where builds are counted"),
        Option("faults", dict, {}, "build index -> fault"),
    )

    def build(self, route: Route, ctx: BuildContext) -> Artifact:
        marker_dir = Path(str(ctx.model.options["marker_dir"]))
        index = _next_build(marker_dir)
        faults = dict(ctx.model.options.get("faults", {}))
        first_default = "default" in faults and self._first_default(route, ctx)
        key = str(index) if str(index) in faults else "default" if first_default else ""
        fault = faults.get(key)
        if fault == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif fault == "hang":
            while True:
                time.sleep(1)
        elif fault == "block":
            _block(marker_dir, key)
        elif fault == "error":
            raise RuntimeError("scripted build failure")
        elif fault and fault.startswith("errno-"):
            code = getattr(errno, fault.removeprefix("errno-"))
            raise OSError(code, os.strerror(code), str(ctx.out_dir))
        elif fault == "orphan":
            _announce(marker_dir, f"orphan-{key}")
            while True:
                time.sleep(1)
        artifact = super().build(route, ctx)
        if fault == "outside":
            outside = marker_dir / f"outside-{key}{artifact.path.suffix}"
            shutil.copyfile(artifact.path, outside)
            return replace(artifact, path=outside)
        return artifact

    def _first_default(self, route: Route, ctx: BuildContext) -> bool:
        """Whether this is the first build of the space's default route (counted across processes)."""
        if dict(route) != self.space(ctx.model).default_route():
            return False
        try:
            os.close(os.open(Path(str(ctx.model.options["marker_dir"])) / "default", os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False


class OtherHostBackend(OnnxRuntimeBackend):
    """ONNX Runtime whose device fingerprint names the CPU `$TUNER_TEST_CPU`: a stand-in for a host with other
    hardware."""

    def device(self) -> dict[str, Any]:
        return {**super().device(), "cpu": os.environ.get("TUNER_TEST_CPU", "test cpu")}


class SameEngineBackend(OnnxRuntimeBackend):
    """ONNX Runtime where every route builds the same engine: the real knobs are pinned to their
    defaults (one intra-op thread) and the only free knob, `noop`, is ignored by build and run.

    A study on it has nothing to find; its "best" trial is luck, which confirmation must expose.
    """

    name = "same-engine"

    def space(self, model: ModelInfo) -> SearchSpace:
        pinned = [
            replace(p, choices=(1,), default=1) if p.name == "intra_op_threads" else replace(p, choices=(p.default,))
            for p in super().space(model).params
        ]
        return SearchSpace((*pinned, Param("noop", ("a", "b", "c", "d", "e", "f"), "a", "changes nothing")))


class SkewedBackend(OnnxRuntimeBackend):
    """ONNX Runtime where the int8 routes are made *fast and wrong* and fp32 routes slow.

    Its runner adds `options.fp32_delay_ms` to every fp32 inference and perturbs the outputs of
    int8 routes, so the unconstrained optimum is infeasible by construction.
    """

    name = "skewed"
    options = (*OnnxRuntimeBackend.options, Option("fp32_delay_ms", float, 5.0, "added to every fp32 inference"))

    def load(self, artifact: Artifact, route: Route, ctx: BuildContext):  # type: ignore[override]
        runner = super().load(artifact, route, ctx)
        delay = float(ctx.model.options.get("fp32_delay_ms", 5.0)) / 1000 if route["precision"] == "fp32" else 0.0
        wrong = str(route["precision"]).startswith("int8")
        inner = runner.infer

        def infer(feed):  # noqa: ANN001, ANN202
            out = inner(feed)
            if delay:
                time.sleep(delay)
            return {k: -v for k, v in out.items()} if wrong else out

        runner.infer = infer  # type: ignore[method-assign]
        return runner


class ClosingBackend(OnnxRuntimeBackend):
    """ONNX Runtime whose runner writes `out_dir/closed` when it is closed, and whose `infer` can be made to raise."""

    name = "closing"
    options = (*OnnxRuntimeBackend.options, Option("fail_infer", bool, False, "make every inference raise"))

    def load(self, artifact: Artifact, route: Route, ctx: BuildContext):  # type: ignore[override]
        runner = super().load(artifact, route, ctx)
        release, marker = runner.release, ctx.out_dir / "closed"

        def release_and_mark() -> None:
            release()
            with open(marker, "a") as f:
                f.write("closed\n")

        runner.release = release_and_mark  # type: ignore[method-assign]
        if ctx.model.options.get("fail_infer"):

            def fail(feed):  # noqa: ANN001, ANN202
                raise RuntimeError("deliberate inference failure")

            runner.infer = fail  # type: ignore[method-assign]
        return runner


class ChattyBackend(OnnxRuntimeBackend):
    """ONNX Runtime whose build prints one line, so every trial that builds leaves a child log for the worker to
    upload."""

    name = "chatty"

    def build(self, route: Route, ctx: BuildContext) -> Artifact:
        print(f"chatty: building precision={route['precision']}", flush=True)
        return super().build(route, ctx)


class BallastBackend(SameEngineBackend):
    """One engine for every route, whose runner holds `ballast_mb` MiB of resident memory while it is loaded
    (the knob's values: 0, the default, 48 and 96), so routes differ in peak memory by known amounts."""

    name = "ballast"

    def space(self, model: ModelInfo) -> SearchSpace:
        return SearchSpace(
            (*super().space(model).params[:-1], Param("ballast_mb", (0, 48, 96), 0, "resident MiB held by the runner"))
        )

    def load(self, artifact: Artifact, route: Route, ctx: BuildContext):  # type: ignore[override]
        runner = super().load(artifact, route, ctx)
        runner.ballast = bytearray(int(route["ballast_mb"]) << 20)  # type: ignore[attr-defined]  # zero-filled: resident
        return runner
