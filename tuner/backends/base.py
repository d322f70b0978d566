"""What every backend is: a search space, *build* (route -> artifact file) and *run* (artifact -> Runner).

A backend knows nothing of Optuna, the database or the worker. `build` and `load` run inside the
trial's isolated child process; `space`, `version` and `device` run in the worker and must be cheap.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from tuner import job as J
from tuner.errors import TrialFailure, require
from tuner.space import Route, SearchSpace

Feed = dict[str, np.ndarray]


@dataclass(frozen=True)
class ModelInfo:
    """What a backend may know about the study's model when it offers a search space."""

    path: Path
    input_shapes: Mapping[str, tuple[int, ...]]
    options: Mapping[str, Any] = field(default_factory=dict)
    # [[objective.shapes]]: (inputs, weight) of every shape the engine must serve; empty: `input_shapes` alone.
    shapes: tuple[tuple[Mapping[str, tuple[int, ...]], float], ...] = ()

    def served(self) -> list[tuple[Mapping[str, tuple[int, ...]], float]]:
        """Every shape the engine serves with its weight: `shapes`, else `input_shapes` at weight 1."""
        return list(self.shapes) or [(self.input_shapes, 1.0)]


@dataclass
class BuildContext:
    """Everything a build may use besides the route."""

    model: ModelInfo
    work_dir: Path  # shared per study: precision variants, timing caches
    out_dir: Path  # private to this trial: the artifact goes here
    calibration: list[Feed]  # the study's validation feeds, for int8 calibration
    deadline_s: float | None = None  # time.monotonic() value after which a cooperative build stops
    log: Callable[[str], None] = print


@dataclass(frozen=True)
class Artifact:
    """A built engine: one file whose bytes are hashed and kept, plus what the build reported.

    `handle` is an optional in-process object (e.g. a compiled module) that `build` hands to `load`
    in the same process so the engine is not compiled twice; it is never serialised, and an
    artifact read back from its file has none (then `load` works from the file alone).
    """

    path: Path
    build_s: float
    info: Mapping[str, Any] = field(default_factory=dict)
    handle: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ExportRequest:
    """What a backend writes its native reproduction from: a trial's route and build record, the study's model.

    `inputs` describes each model input (`shape`, `dtype`, `batch_axis`, and `value` for a study-file
    constant); `shapes` the input shapes it was measured at, each `{"inputs": {name: shape}, "weight": w}`.
    """

    route: Route
    artifact: Path
    build_info: Mapping[str, Any]
    model: ModelInfo
    work_dir: Path
    backend_version: str
    inputs: Mapping[str, Mapping[str, Any]]
    shapes: list[dict[str, Any]]


@dataclass
class Deployment:
    """A backend's native reproduction of an engine, written into an export directory.

    `artifact_name` is the engine file's name there; `files` the other files (name -> text, bytes, or a
    file to copy) and `about` one line on each; `commands` are `reproduce.sh`'s lines, run from the
    export directory; `needs` says what they need installed; `run` is how to use the engine (Markdown
    for the export's README) and `notes` what a user must know about it.
    """

    artifact_name: str
    files: dict[str, str | bytes | Path] = field(default_factory=dict)
    about: dict[str, str] = field(default_factory=dict)
    executables: tuple[str, ...] = ()
    commands: list[str] = field(default_factory=list)
    needs: str = ""
    run: str = ""
    notes: list[str] = field(default_factory=list)


class Runner(abc.ABC):
    """A loaded artifact that can run inference and time itself.

    Lifecycle (after Polygraphy's BaseRunner activate/deactivate): `Backend.load` returns an active
    runner that the caller owns; use it as a context manager (`with backend.load(...) as runner:`)
    so `close()` runs exactly once when the block ends, also when it raised. A runner wrapping
    another one owns it when `owns_inner` is true and closes it from its own `release`.
    Subclasses override `release`, never `close`.
    """

    closed: bool = False

    def __enter__(self) -> Runner:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.close()
        except Exception as close_exc:
            if exc is None:
                raise
            exc.add_note(f"closing the runner afterwards failed too: {type(close_exc).__name__}: {close_exc}")

    @abc.abstractmethod
    def infer(self, feed: Feed) -> dict[str, np.ndarray]:
        """Run one inference and return the outputs as host arrays keyed by output name."""

    def timed(self, feed: Feed) -> Callable[[], float]:
        """A callable doing one inference on `feed` and returning its latency in seconds.

        The default times `infer` with the host clock; GPU runners override it with device-side
        timing (CUDA events) and keep transfers outside the timed region.
        """
        import time

        def once() -> float:
            t0 = time.perf_counter()
            self.infer(feed)
            return time.perf_counter() - t0

        return once

    def timed_batch(self, feed: Feed) -> Callable[[int], float]:
        """A callable doing `n` inferences on `feed` back to back and returning their total seconds.

        For the pipelined objective (`[objective] mode = "pipelined"`). The default times `n` calls
        of `infer` with the host clock; GPU runners enqueue the `n` calls between one event pair.
        """
        import time

        def many(n: int) -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                self.infer(feed)
            return time.perf_counter() - t0

        return many

    def timing_info(self) -> dict[str, Any]:
        """Facts to store with a latency measurement (clock source, device clocks, ...)."""
        return {"clock": "host-perf_counter"}

    def clock(self) -> float:
        """Seconds on the clock the measurement of this runner's latencies runs against (a replayed runner's is
        virtual)."""
        import time

        return time.perf_counter()

    def close(self) -> None:
        """Release the runner's resources once; later calls do nothing."""
        if self.closed:
            return
        self.closed = True
        self.release()

    def release(self) -> None:  # noqa: B027 - optional hook: most runners hold nothing to release
        """Free what this runner owns (sessions, device memory, owned inner runners)."""


class BuildError(TrialFailure):
    """The backend could not build this route; the message is recorded with the trial."""

    failure_class = J.BUILD_ERROR


class RuntimeRefused(TrialFailure):
    """The engine was built but this machine's runtime cannot run it (e.g. an unsupported GPU)."""

    failure_class = J.RUNTIME_UNSUPPORTED


@dataclass(frozen=True)
class Option:
    """One declared `[backend.options]` key: its type, default and a one-line doc.

    `choices` narrows the values to a list; `check` returns what is wrong with a value (or None).
    Read an option through `get` so its default lives here and nowhere else.
    """

    name: str
    type: type | tuple[type, ...]
    default: Any
    doc: str
    choices: tuple[Any, ...] = ()
    check: Callable[[Any], str | None] | None = None

    def get(self, options: Mapping[str, Any]) -> Any:
        """The study's value, or the default."""
        return options.get(self.name, self.default)

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` for this option, as the expected form; None when it is fine."""
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        if float in types and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return f"expected {self.kind()}, got {value!r}"
        if self.choices and value not in self.choices:
            return f"expected one of {', '.join(map(repr, self.choices))}, got {value!r}"
        return self.check(value) if self.check else None

    def kind(self) -> str:
        """The accepted values in words: the choices, else the type."""
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        return (
            " | ".join(map(repr, self.choices))
            if self.choices
            else " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
        )


_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    dict: "a table",
    list: "a list",
}


class Backend(abc.ABC):
    """A compiler that turns a route into an artifact and runs it.

    `options` declares the `[backend.options]` keys the backend reads (checked when the study file
    is loaded: an undeclared key or a bad value is one line there, not a failure of every trial).
    """

    name: str = ""
    options: tuple[Option, ...] = ()
    requires: tuple[tuple[str, str], ...] = ()  # (module, how to install it): libraries the backend cannot work without

    def check_libraries(self) -> None:
        """Raise MissingLibrary (one line naming what to install) when a library in `requires` is absent."""
        for module, install in self.requires:
            require(module, f"the {self.name} backend", install)

    preload: tuple[str, ...] = ()  # modules a pre-imported child server imports for this backend (see `fork_safe`)

    def fork_safe(self, route: Route, options: Mapping[str, Any]) -> bool:
        """Whether `route`'s trial child, with the study's backend `options`, may be forked from a server that imported
        `preload` (False: a fresh interpreter).

        Only where nothing imported initialises a device runtime: CUDA cannot be used in a child
        forked after its parent initialised it, so GPU routes keep a fresh process.
        """
        return False

    def build_uses_host_cores(self, options: Mapping[str, Any]) -> bool:
        """Whether `build` keeps this host's CPU cores busy, so that a CPU timing must wait for it (True by default)."""
        return True

    def option_problem(self, options: Mapping[str, Any]) -> tuple[str, str] | None:
        """The first (key, expected) wrong with a study's backend options, or None."""
        declared = {o.name: o for o in self.options}
        for key, value in options.items():
            if key not in declared:
                known = ", ".join(declared) or "none"
                return key, f"unknown option of the {self.name or type(self).__name__} backend; it takes: {known}"
            problem = declared[key].problem(value)
            if problem:
                return key, problem
        return None

    def study_attrs(self, model: ModelInfo) -> dict[str, Any]:
        """Facts recorded with a new study (e.g. the compiler's knob database version); none by default."""
        return {}

    def capabilities(self) -> dict[str, Any]:
        """Extra facts for `tuner probe` about what this backend can do here; none by default."""
        return {}

    @abc.abstractmethod
    def version(self) -> str:
        """The compiler's version string; part of every cache key."""

    @abc.abstractmethod
    def device(self) -> dict[str, Any]:
        """The device fingerprint (CPU model or GPU name, driver, runtime versions); part of cache keys."""

    @abc.abstractmethod
    def space(self, model: ModelInfo) -> SearchSpace:
        """The routes this backend offers for `model` on this machine."""

    @abc.abstractmethod
    def build(self, route: Route, ctx: BuildContext) -> Artifact:
        """Build `route` into an artifact under `ctx.out_dir`; raise BuildError on failure."""

    @abc.abstractmethod
    def load(self, artifact: Artifact, route: Route, ctx: BuildContext) -> Runner:
        """Load a built artifact for inference."""

    def deployment(self, request: ExportRequest) -> Deployment:
        """The files and commands that run (and rebuild) `request`'s engine outside the tuner, natively.

        Runs where the study ran, from what the trial recorded (its route and `build_info`): the
        compiler need not be importable.
        """
        return Deployment(
            artifact_name=f"engine{request.artifact.suffix}",
            notes=[
                f"The {self.name or type(self).__name__} backend has no native reproduction: "
                "the engine file and route.json are what there is."
            ],
        )

    def learned_failure(
        self, route: Route, model: ModelInfo, work_dir: Path, model_sha: str, data_sha: str
    ) -> tuple[str, str] | None:
        """(key, what) of a product `route` needs that already failed to build, or None.

        Runs in the worker before any child starts: it must only compute keys and look them up.
        """
        return None

    def preparation(
        self, model: ModelInfo, space: SearchSpace, work_dir: Path, log: Callable[[str], None] = print
    ) -> list[dict[str, Any]]:
        """Prepare the model once before any variant `space` offers (cached by content); what was done, step by step."""
        return []

    def seed_routes(self, model: ModelInfo) -> list[Route]:
        """Routes the compiler's own documentation recommends, tried right after the default route."""
        return []
