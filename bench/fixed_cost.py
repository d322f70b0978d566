"""A workload of fixed, known cost for benchmarking the tuner itself (not a compiler).

Its "build" sleeps `options.build_s` seconds (a stand-in for compile time that needs no CPU) and
copies the model; it then runs the real model with ONNX Runtime. Used by bench/scaling.py.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.backends.base import Artifact, Backend, BuildContext, ModelInfo, Option, Runner
from tuner.backends.device import cpu_fingerprint
from tuner.space import Param, Route, SearchSpace

BUILD_S = Option("build_s", float, 1.0, "seconds each build sleeps")
IDLE_BUILD = Option(
    "idle_build", bool, False, "the sleeping build leaves the host's cores free, so CPU timings need not wait for it"
)


class FixedCostBackend(Backend):
    """Routes that all cost `build_s` seconds to build and run the same real model."""

    name = "fixed-cost"
    options = (BUILD_S, IDLE_BUILD)
    preload = ("onnxruntime", "tuner.backends.onnxruntime.run")

    def fork_safe(self, route: Route, options: Mapping[str, Any]) -> bool:
        """Its engines run on ONNX Runtime's CPU provider: a forked child is as good as a fresh one."""
        return True

    def version(self) -> str:
        return "1"

    def device(self) -> dict[str, Any]:
        return cpu_fingerprint()

    def build_uses_host_cores(self, options: Mapping[str, Any]) -> bool:
        """A sleep uses no core, but by default it holds them like a compiler would (see `idle_build`)."""
        return not IDLE_BUILD.get(options)

    def space(self, model: ModelInfo) -> SearchSpace:
        return SearchSpace(
            (Param("a", tuple(range(8)), 0), Param("b", tuple(range(8)), 0), Param("c", tuple(range(8)), 0))
        )

    def build(self, route: Route, ctx: BuildContext) -> Artifact:
        t0 = time.perf_counter()
        time.sleep(float(BUILD_S.get(ctx.model.options)))
        ctx.out_dir.mkdir(parents=True, exist_ok=True)
        out = ctx.out_dir / "engine.onnx"
        shutil.copyfile(ctx.model.path, out)
        return Artifact(out, time.perf_counter() - t0)

    def load(self, artifact: Artifact, route: Route, ctx: BuildContext) -> Runner:
        from tuner.backends.onnxruntime.run import OrtRunner

        return OrtRunner(
            artifact,
            {
                "provider": "cpu",
                "execution_mode": "sequential",
                "intra_op_threads": 1,
                "cpu_mem_arena": True,
                "mem_pattern": True,
            },
        )


BUILD_LOG = Option(
    "build_log", str, "", "a directory where every build records its route, start and end (bench/chaos.py)"
)


class LoggedFixedCostBackend(FixedCostBackend):
    """FixedCostBackend that records each build (route, pid, start, end) as one JSON file in `options.build_log`.

    A build that is killed leaves its record without an end; bench/chaos.py counts overlapping
    builds of one route from these records.
    """

    name = "fixed-cost-logged"
    options = (BUILD_S, IDLE_BUILD, BUILD_LOG)

    def space(self, model: ModelInfo) -> SearchSpace:
        """8^6 routes, so a short random study almost never samples one route twice."""
        return SearchSpace(tuple(Param(n, tuple(range(8)), 0) for n in "abcdef"))

    def build(self, route: Route, ctx: BuildContext) -> Artifact:
        record = Path(str(BUILD_LOG.get(ctx.model.options))) / f"{time.time_ns()}-{os.getpid()}.json"
        entry: dict[str, Any] = {"route": dict(route), "pid": os.getpid(), "start": time.time()}
        _write_whole(record, entry)
        artifact = super().build(route, ctx)
        _write_whole(record, {**entry, "end": time.time()})
        return artifact


def _write_whole(record: Path, entry: Mapping[str, Any]) -> None:
    """Write `entry` as `record` whole or not at all: a build killed while it writes leaves its earlier record (or
    none, and a `.tmp` file beside it), never an empty or half-written one.

    Not `tuner.files.atomic_write`: its temporary file keeps the `.json` suffix, so one left by a SIGKILL would be
    read as a record by bench/chaos.py, and its fsyncs would add disk waits to every build of the chaos study."""
    tmp = record.with_suffix(".tmp")
    tmp.write_text(json.dumps(entry))
    tmp.replace(record)
