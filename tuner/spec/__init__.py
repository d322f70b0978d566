"""The study file (TOML): what to tune, how to judge it, where to keep it."""

from tuner.spec.model import (
    AccuracySpec,
    BackendSpec,
    DataSpec,
    ModelSpec,
    ObjectiveSpec,
    RunSpec,
    Spec,
)
from tuner.spec.load import load_spec, resolve_storage

__all__ = [
    "AccuracySpec",
    "BackendSpec",
    "DataSpec",
    "ModelSpec",
    "ObjectiveSpec",
    "RunSpec",
    "Spec",
    "load_spec",
    "resolve_storage",
]
