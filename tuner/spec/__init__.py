"""The study file (TOML): what to tune, how to judge it, where to keep it."""

from tuner.spec.load import load_spec, resolve_storage
from tuner.spec.model import (
    AccuracySpec,
    BackendSpec,
    DataSpec,
    InputData,
    ModelSpec,
    ObjectiveSpec,
    RunSpec,
    Spec,
)

__all__ = [
    "AccuracySpec",
    "BackendSpec",
    "DataSpec",
    "InputData",
    "ModelSpec",
    "ObjectiveSpec",
    "RunSpec",
    "Spec",
    "load_spec",
    "resolve_storage",
]
