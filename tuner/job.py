"""The trial-outcome vocabulary: the job a worker hands a trial's child, the result it gets back, and the statuses.

A neutral module below `tuner.worker`, `tuner.study` and the backends: all of them speak it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from tuner.objective import ObjectiveSpec


@dataclass(frozen=True)
class Outcome:
    """One way a trial can end: its name, one line for the README, and how it is tallied.

    `tally` says where `tuner status` counts it: "complete" (timed: COMPLETE in Optuna), "pruned" (stopped early:
    failed the accuracy gate, or slower than the incumbent: PRUNED), "failed" (the route failed to build or run:
    PRUNED, counted in the budget) or "requeued" (interrupted, lost or environment-error: FAIL, not counted, re-queued).
    `deterministic` outcomes depend only on the cache key, so a stored result may be reused.
    """

    name: str
    doc: str
    tally: str
    deterministic: bool = False


OUTCOMES: dict[str, Outcome] = {}
TALLIES = ("complete", "pruned", "failed", "requeued")


def outcome(name: str, doc: str, tally: str = "failed", deterministic: bool = False) -> str:
    """Declare an outcome (once, here) and return its name; adding a failure class is one call."""
    if tally not in TALLIES or name in OUTCOMES:
        raise ValueError(f"outcome {name!r}: tally must be one of {TALLIES} and the name new")
    OUTCOMES[name] = Outcome(name, doc, tally, deterministic)
    return name


# Every outcome a trial can end with. The error types that raise a failure carry its name
# (`TrialFailure.failure_class`, tuner/errors.py); the README's list is generated from here.
OK = outcome("ok", "timed and within the accuracy tolerance", "complete", deterministic=True)
GATE_FAILED = outcome("accuracy-gate", "failed the quick accuracy gate; never timed", "pruned", deterministic=True)
ACCURACY = outcome(
    "accuracy", "timed, but full accuracy is outside the tolerance (infeasible)", "complete", deterministic=True
)
BUILD_ERROR = outcome("build-error", "the backend could not build the route", deterministic=True)
RUNTIME_ERROR = outcome("runtime-error", "the engine was built but raised while loading or running")
RUNTIME_UNSUPPORTED = outcome(
    "runtime-unsupported", "the engine was built but this machine's runtime refuses to run it", deterministic=True
)
INVALID_ROUTE = outcome(
    "invalid-route", "the route breaks a rule of the search space; nothing was built", deterministic=True
)
UNKNOWN_SWITCH = outcome(
    "unknown-switch", "Inductor: a configuration name or value the installed torch does not accept"
)
ROUTE_REJECTED = outcome("route-rejected", "TensorRT did not take the build route as given; nothing was built")
TIMEOUT = outcome("timeout", "the trial ran past its wall-clock limit; its process group was killed")
CRASH_SIGNAL = outcome(
    "crash-signal", "the trial's child died of a signal (segfault, abort); SIGKILL is an environment error"
)
CRASH_EXIT = outcome("crash-exit", "the trial's child exited without a result")
SLOW = outcome("slow", "stopped during timing: its paired speedup interval already lay below the incumbent's", "pruned")
KNOWN_FAILURE = outcome(
    "known-failure",
    "needs a product (variant, prepared model) that already failed to build; no child ran, no budget used",
)
INTERRUPTED = outcome("interrupted", "the run was stopped (Ctrl-C, SIGTERM) while the trial ran", "requeued")
LOST = outcome("lost", "the trial's worker vanished or it ran past its deadline; a live worker reaped it", "requeued")
GIVEN_UP = outcome(
    "given-up", "the route was lost in `[run] max_attempts` runs (default 3); failed once, counted, not re-queued"
)
ENVIRONMENT_ERROR = outcome(
    "environment-error",
    "the machine, not the route: disk full, out of memory (SIGKILL), device busy; "
    "run again up to 3 times, never cached, then re-queued while the worker pauses",
    "requeued",
)


def outcomes(tally: str) -> frozenset[str]:
    """The names of every outcome tallied as `tally`."""
    return frozenset(o.name for o in OUTCOMES.values() if o.tally == tally)


def failure_list() -> str:
    """The README's list of outcomes other than success, one Markdown bullet each."""
    return "\n".join(f"- `{o.name}` ({o.tally}): {o.doc}" for o in OUTCOMES.values() if o.name != OK)


# Outcomes that depend only on the cache key (so a stored result may be reused).
DETERMINISTIC = frozenset(o.name for o in OUTCOMES.values() if o.deterministic)


@dataclass
class Job:
    """Everything the child needs; written by the worker as JSON."""

    backend: str
    route: dict[str, Any]
    model_path: str
    input_shapes: dict[str, list[int]]
    options: dict[str, Any]
    work_dir: str
    out_dir: str
    feeds_path: str
    reference_path: str
    metric: str
    tolerance: float
    atol: float
    rtol: float
    gate_samples: int
    timeout_s: float  # the trial's own time: its lock waits are not counted in it (`tuner.worker.isolate`)
    lock_wait_s: float | None = None  # the most the child waits for host/device locks in all; then environment-error
    # How it is timed: the study's [objective] settings (tuner.objective; None: the device's default).
    objective: ObjectiveSpec = field(default_factory=ObjectiveSpec)
    role: str = "candidate"  # "baseline": the study's default route, measured alone (its speedup is 1)
    baseline: dict[str, Any] | None = None  # the baseline engine to pair with: {"trial", "path", "sha256", "route"}
    baseline_wait_s: float = 0.0  # how long the trial waited for the baseline trial to finish before its timing
    unpaired: str = ""  # why there is no baseline to pair with, when the worker knows (tuner.worker.pairing)
    # Started while the baseline trial ran: the pairing fields (role, baseline, incumbent, ...) come later, written
    # to this file by the worker; the child waits for them before its timing, at most `pairing_wait_s`
    # (tuner.worker.handover). Empty: the job carries its pairing.
    pairing_path: str = ""
    pairing_wait_s: float = 0.0
    # The engines trade places: `route` is the default's and `baseline` the candidate's engine. The child loads and
    # gates the route's engine as always but times `baseline` as the candidate, so what the route's own loading path
    # gives its engine goes to the default; the confirmation alternates this (tuner.worker.timing).
    swapped: bool = False
    incumbent: float | None = None  # stop as `slow` when the speedup interval lies entirely below this
    incumbent_high: float | None = None  # stop as `ahead` when it lies entirely above this
    # The build occupies the host's cores (`Backend.build_uses_host_cores`): the child then starts and builds
    # under a shared hold of the host lock (tuner.measure.exclusive), so no CPU timing runs meanwhile.
    build_holds_cores: bool = True
    # [[objective.shapes]]: per shape {"inputs", "weight", "feeds_path", "reference_path"}; empty: the one shape
    # `input_shapes` with `feeds_path`/`reference_path`.
    shapes: list[dict[str, Any]] = field(default_factory=list)
    # Fork the child from a server that has imported these modules (`Backend.fork_safe`, tuner.worker.forkserver);
    # None: a fresh interpreter.
    preload: list[str] | None = None
    # [accuracy.outputs.NAME]: the outputs with their own metric and tolerance, {name: Rule.plain()}
    # (tuner.measure.judge).
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def write(self, path: Path) -> None:
        """Save as JSON."""
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, path: Path) -> Job:
        """Load from JSON."""
        data = json.loads(path.read_text())
        return cls(**{**data, "objective": ObjectiveSpec.from_plain(data["objective"])})


@dataclass
class Result:
    """What a trial produced. `status` is OK or a failure class."""

    status: str
    message: str = ""
    phase: str = ""
    build_s: float | None = None
    artifact_path: str | None = None
    artifact_sha256: str | None = None
    artifact_bytes: int | None = None
    build_info: dict[str, Any] = field(
        default_factory=dict
    )  # what the build reported (Artifact.info), e.g. how it optimised
    peak_memory_mb: float | None = (
        None  # what loading and running the engine added at its highest (tuner.measure.memory)
    )
    memory_kind: str = ""  # "host-rss" or "device"
    latency: dict[str, float] | None = None
    samples_ms: list[float] = field(default_factory=list)
    baseline_samples_ms: list[float] = field(default_factory=list)  # the baseline engine's, when timed paired
    accuracy: float | None = None
    accuracy_per_output: dict[str, float] = field(default_factory=dict)
    timing_info: dict[str, Any] = field(default_factory=dict)
    phase_s: dict[str, float] = field(default_factory=dict)  # seconds in build/load/gate/(baseline-wait)/time/accuracy
    paired: dict[str, Any] = field(default_factory=dict)  # the paired timing's summary (tuner.worker.timing)
    log: str = ""

    def to_json(self) -> str:
        """Serialise (non-finite floats as strings so any JSON reader accepts them).

        Field by field, not `asdict`: the fields hold plain JSON values already, and `asdict` copies each
        of the raw samples (tens of thousands for a model that runs in microseconds) before encoding.
        """
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)}, default=str, allow_nan=True)

    @classmethod
    def from_json(cls, text: str) -> Result:
        """Deserialise."""
        data = json.loads(text)
        if isinstance(data.get("accuracy"), str):
            data["accuracy"] = float(data["accuracy"])
        data["accuracy_per_output"] = {k: float(v) for k, v in (data.get("accuracy_per_output") or {}).items()}
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


if __name__ == "__main__":
    print(failure_list())


def wait_log(result_path: Path) -> Path:
    """Where the child writing `result_path` reports its lock waits (`tuner.measure.exclusive.report_waits`)."""
    return result_path.with_name("lock-waits.json")
