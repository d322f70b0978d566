"""Typed, validated contents of a study file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.measure.judge import Rule
from tuner.objective import ObjectiveSpec


@dataclass(frozen=True)
class ModelSpec:
    """The ONNX model: each input's shape (`()` for a scalar), numpy dtype name and batch axis, and the dimensions
    the graph declares (`dims`: None where one is dynamic; None for an input of unknown rank).

    `batch_axes[name]` is the axis along which a data file's samples are laid out (0 unless the study
    file says otherwise); a scalar input has none (None).
    """

    path: Path
    inputs: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]
    batch_axes: dict[str, int | None] = field(default_factory=dict)
    dims: dict[str, tuple[int | None, ...] | None] = field(default_factory=dict)  # the graph's (None: dynamic)

    def batch_axis(self, name: str) -> int | None:
        """The batch axis of input `name`: as declared, else 0, and None for a scalar."""
        return self.batch_axes.get(name, 0 if self.inputs[name] else None)


@dataclass(frozen=True)
class InputData:
    """What one input holds in every validation feed: a constant `value`, or values drawn from [low, high)."""

    value: float | int | bool | None = None
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class DataSpec:
    """Validation inputs: an .npz file (arrays keyed by input name, samples along each batch axis) or a
    seeded generator; `inputs` gives per-input constants or ranges (`[data.inputs.NAME]`)."""

    file: Path | None
    seed: int
    samples: int  # number of feeds used for accuracy
    gate_samples: int  # feeds checked before timing (the quick accuracy gate)
    low: float = -1.0
    high: float = 1.0
    inputs: dict[str, InputData] = field(default_factory=dict)


@dataclass(frozen=True)
class AccuracySpec:
    """The accuracy metric (a built-in name or `package.module:function`, `tuner.measure.user_metric`), its
    tolerance, atol/rtol for `outside_tol`, and the outputs with their own metric and tolerance
    (`[accuracy.outputs.NAME]`, `tuner.measure.judge`). `metric_sha256`: the hash of a study function's file."""

    metric: str
    tolerance: float
    atol: float = 1e-3
    rtol: float = 1e-3
    outputs: dict[str, Rule] = field(default_factory=dict)
    metric_sha256: str = ""

    def settings(self) -> dict[str, Any]:
        """What a measured accuracy depends on, for cache keys and fingerprints (the newer entries only when
        used, so the keys of studies without them stay as they were)."""
        out: dict[str, Any] = {"metric": self.metric, "atol": self.atol, "rtol": self.rtol}
        if self.metric_sha256:
            out["metric_sha256"] = self.metric_sha256
        if self.outputs:
            out["outputs"] = {k: v.plain() for k, v in sorted(self.outputs.items())}
        return out


@dataclass(frozen=True)
class BackendSpec:
    """The backend, restrictions of its search space, and backend-specific options."""

    name: str
    space: dict[str, list[Any]] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)


DEFAULT_STARTUP_TRIALS = 4  # TPE's random start-up trials (chosen by the delivered-route benchmark)
DEADLINE_TIMEOUTS = 8  # trial timeouts in a trial's deadline: 1 baseline wait + 3 child runs x (run + lock waits) + 1
DEFAULT_SAMPLER = "local"  # chosen by the delivered-route benchmark (docs/search-efficiency.md)


WARM_START_MODES = ("auto", "off")  # [run] warm_start


@dataclass(frozen=True)
class RunSpec:
    """How the study runs: budget, workers, timeouts, leases, sampler; what `tuner gc` keeps and the size cap."""

    budget: int
    workers: int = 1
    trial_timeout_s: float = 600.0
    heartbeat_s: float = 5.0
    grace_s: float = 60.0
    max_attempts: int = 3  # runs of a route that end `lost` before it is failed (`given-up`, counted)
    sampler: str = DEFAULT_SAMPLER
    seed: int = 0
    startup_trials: int = DEFAULT_STARTUP_TRIALS  # chosen in docs/search-efficiency.md
    racing: bool = True  # re-measure close leaders during the study (tuner.worker.race)
    # "auto": start a new study from other models' studies in the storage (tuner.study.warm_start); off by default:
    # in the search benchmark it took more builds than a cold start on all eight targets (docs/search-efficiency.md)
    warm_start: str = "off"
    keep_best: int = 3  # feasible trials whose artifacts `tuner gc` keeps (with the baseline and confirmed ones)
    max_disk_mb: float | None = None  # `tuner run` collects garbage when the work dir grows past this
    mix_devices: bool = False  # workers on other hardware than the study's first may join (timings then mix devices)
    timeout_s: float | None = None  # wall-clock cap of one `tuner run`: then the trials in flight are re-queued

    @property
    def deadline_s(self) -> float:
        """A trial's wall-clock deadline from its lease (database clock): any live worker reaps it after that,
        whatever its heartbeat says. It covers the longest legitimate trial: the wait for the baseline, then
        three runs of the child (environment errors), each with its bounded lock waits (`DEADLINE_TIMEOUTS`)."""
        return self.trial_timeout_s * DEADLINE_TIMEOUTS + self.grace_s


@dataclass(frozen=True)
class Spec:
    """A whole, validated study file."""

    path: Path
    study: str
    storage: str  # may be empty: resolve_storage() picks the default
    work_dir: Path
    model: ModelSpec
    data: DataSpec
    accuracy: AccuracySpec
    objective: ObjectiveSpec
    backend: BackendSpec
    run: RunSpec
    raw: dict[str, Any] = field(default_factory=dict, compare=False)
