"""A study's own accuracy metric: `[accuracy] metric = "package.module:function"`.

The function is called once per check (the quick gate, then the full check, at each input shape) with every
feed's outputs::

    def metric(reference: list[dict[str, np.ndarray]], candidate: list[dict[str, np.ndarray]]) -> float: ...

`reference[i]` and `candidate[i]` are feed `i`'s outputs keyed by output name (the fp32 reference and the
engine under test). It returns one number, lower is better and 0 a perfect match, compared with `[accuracy]
tolerance` like the built-in metrics. A candidate that lacks an output, has an output of another shape or holds a
non-finite value is infinitely bad without the function being called.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from tuner import job as J
from tuner.errors import TrialFailure, first_line

MetricFn = Callable[[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]], float]


class MetricError(TrialFailure):
    """A study's own metric raised or returned something other than a number: the route's failure."""

    failure_class = J.RUNTIME_ERROR


def is_plugin(name: str) -> bool:
    """Whether a metric name is of the form `package.module:function`."""
    return ":" in name


def load_metric(name: str) -> MetricFn:
    """The function `package.module:function`; ValueError with a one-line reason when it cannot be used."""
    module_name, _, attr = name.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # any error while importing the user's module is theirs to fix
        raise ValueError(f"cannot import {name!r} ({type(exc).__name__}: {first_line(exc)})") from exc
    if not callable(fn):
        raise ValueError(f"{name!r} is not callable (a value of type {type(fn).__name__})")
    return fn


def source_hash(fn: MetricFn) -> str:
    """The sha256 of the file that defines `fn` (empty when it has none): part of the cache key, so editing the
    metric measures accuracy again."""
    try:
        path = inspect.getsourcefile(inspect.unwrap(fn)) or inspect.getfile(fn)
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except (TypeError, OSError):
        return ""


def _valid(outputs: Sequence[Mapping[str, np.ndarray]], reference: Sequence[Mapping[str, np.ndarray]]) -> bool:
    for got, ref in zip(outputs, reference, strict=True):
        for name, r in ref.items():
            a = got.get(name)
            if a is None or np.shape(a) != np.shape(r) or not np.all(np.isfinite(np.asarray(a, dtype=np.float64))):
                return False
    return True


def evaluate(
    name: str,
    fn: MetricFn,
    outputs: Sequence[Mapping[str, np.ndarray]],
    reference: Sequence[Mapping[str, np.ndarray]],
) -> float:
    """`fn` on the feeds given; MetricError (naming the metric) when it raises or returns no number >= 0."""
    if not _valid(outputs, reference):
        return math.inf
    ref = [{k: np.asarray(v) for k, v in r.items()} for r in reference]
    got = [{k: np.asarray(v) for k, v in o.items()} for o in outputs]
    try:
        value = fn(ref, got)
    except Exception as exc:  # the user's code: its error is this route's failure, in one line
        raise MetricError(f"accuracy.metric {name!r} raised {type(exc).__name__}: {first_line(exc)}") from exc
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise MetricError(f"accuracy.metric {name!r} returned {value!r}, expected a number") from None
    if math.isnan(number) or number < 0:
        raise MetricError(f"accuracy.metric {name!r} returned {number}, expected a number >= 0")
    return number
