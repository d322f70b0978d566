"""Backend registry: one package per compiler, looked up by the study file's `backend.name`.

A name of the form `package.module:ClassName` loads a backend class from an importable module, so a
site can plug in its own compiler (the tests use this for deliberately crashing backends).
"""

from __future__ import annotations

import importlib

from tuner.backends.base import Backend
from tuner.errors import TunerError

BUILTIN = {
    "onnxruntime": "tuner.backends.onnxruntime:OnnxRuntimeBackend",
    "tensorrt": "tuner.backends.tensorrt:TensorRTBackend",
    "inductor": "tuner.backends.inductor:InductorBackend",
    "replay": "tuner.backends.replay:ReplayBackend",
}


def backend_names() -> list[str]:
    """The names of the built-in backends."""
    return sorted(BUILTIN)


def get_backend(name: str) -> Backend:
    """Instantiate the backend called `name` (a built-in name or `module:Class`)."""
    target = BUILTIN.get(name, name if ":" in name else None)
    if target is None:
        raise TunerError(f"unknown backend {name!r}; expected one of {', '.join(backend_names())} or module:Class")
    module_name, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise TunerError(f"backend {name!r} cannot be loaded: {exc}") from exc
    return cls()
