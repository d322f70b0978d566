"""The trial-outcome vocabulary: the job a worker hands a trial's child, the result it gets back, and the statuses.

A neutral module below `tuner.worker`, `tuner.study` and the backends: all of them speak it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Failure classes a trial can end with besides success.
OK = "ok"
GATE_FAILED = "accuracy-gate"
ACCURACY = "accuracy"
BUILD_ERROR = "build-error"
RUNTIME_ERROR = "runtime-error"
RUNTIME_UNSUPPORTED = "runtime-unsupported"
INVALID_ROUTE = "invalid-route"
TIMEOUT = "timeout"
CRASH_SIGNAL = "crash-signal"
CRASH_EXIT = "crash-exit"
INTERRUPTED = "interrupted"
LOST = "lost"

# Outcomes that depend only on the cache key (so a stored result may be reused).
DETERMINISTIC = {OK, GATE_FAILED, ACCURACY, BUILD_ERROR, INVALID_ROUTE, RUNTIME_UNSUPPORTED}


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
    warmup_s: float
    min_repeats: int
    min_duration_s: float
    timeout_s: float

    def write(self, path: Path) -> None:
        """Save as JSON."""
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, path: Path) -> Job:
        """Load from JSON."""
        return cls(**json.loads(path.read_text()))


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
    latency: dict[str, float] | None = None
    samples_ms: list[float] = field(default_factory=list)
    accuracy: float | None = None
    accuracy_per_output: dict[str, float] = field(default_factory=dict)
    timing_info: dict[str, Any] = field(default_factory=dict)
    phase_s: dict[str, float] = field(default_factory=dict)  # seconds spent in build/load/gate/time/accuracy
    log: str = ""

    def to_json(self) -> str:
        """Serialise (non-finite floats as strings so any JSON reader accepts them)."""
        return json.dumps(asdict(self), default=str, allow_nan=True)

    @classmethod
    def from_json(cls, text: str) -> Result:
        """Deserialise."""
        data = json.loads(text)
        if isinstance(data.get("accuracy"), str):
            data["accuracy"] = float(data["accuracy"])
        data["accuracy_per_output"] = {k: float(v) for k, v in (data.get("accuracy_per_output") or {}).items()}
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
