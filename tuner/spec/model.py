"""Typed, validated contents of a study file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    """The ONNX model and the shape of each input (batch axis first)."""

    path: Path
    inputs: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]


@dataclass(frozen=True)
class DataSpec:
    """Validation inputs: an .npz file (arrays keyed by input name, sample axis first) or a seeded generator."""

    file: Path | None
    seed: int
    samples: int  # number of feeds used for accuracy
    gate_samples: int  # feeds checked before timing (the quick accuracy gate)
    low: float = -1.0
    high: float = 1.0


@dataclass(frozen=True)
class AccuracySpec:
    """The accuracy metric, its tolerance, and atol/rtol for `outside_tol`."""

    metric: str
    tolerance: float
    atol: float = 1e-3
    rtol: float = 1e-3


@dataclass(frozen=True)
class ObjectiveSpec:
    """Which latency statistic to minimise and how to measure it."""

    statistic: str = "median"
    warmup_s: float = 0.2
    min_repeats: int = 20
    min_duration_s: float = 1.0


@dataclass(frozen=True)
class BackendSpec:
    """The backend, restrictions of its search space, and backend-specific options."""

    name: str
    space: dict[str, list[Any]] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunSpec:
    """How the study runs: budget, workers, timeouts, leases, sampler."""

    budget: int
    workers: int = 1
    trial_timeout_s: float = 600.0
    heartbeat_s: float = 5.0
    grace_s: float = 60.0
    sampler: str = "tpe"
    seed: int = 0
    startup_trials: int = 8


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
