"""The study file (TOML): what to tune, how to judge it, where to keep it."""

from tuner.spec.load import load_spec, make_storage_dir, resolve_storage, spec_from_doc
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
    "make_storage_dir",
    "resolve_storage",
    "spec_from_doc",
]
