"""Accuracy metrics between an engine's outputs and the fp32 reference, per output tensor.

Every metric is "lower is better, 0 is a perfect match", so one tolerance compares against any of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

Outputs = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Tolerances:
    """atol/rtol for the `outside_tol` metric: an element is bad when |a-r| > atol + rtol*|r|."""

    atol: float = 1e-3
    rtol: float = 1e-3


def _max_abs(a: np.ndarray, r: np.ndarray, tol: Tolerances) -> float:
    return float(np.max(np.abs(a - r))) if a.size else 0.0


def _mean_abs(a: np.ndarray, r: np.ndarray, tol: Tolerances) -> float:
    return float(np.mean(np.abs(a - r))) if a.size else 0.0


def _rms(a: np.ndarray, r: np.ndarray, tol: Tolerances) -> float:
    return float(np.sqrt(np.mean((a - r) ** 2))) if a.size else 0.0


def _cosine(a: np.ndarray, r: np.ndarray, tol: Tolerances) -> float:
    """Worst (largest) cosine distance over samples, each sample flattened."""
    a2, r2 = a.reshape(a.shape[0], -1), r.reshape(r.shape[0], -1)
    num = np.sum(a2 * r2, axis=1)
    den = np.linalg.norm(a2, axis=1) * np.linalg.norm(r2, axis=1)
    same = (den == 0) & (np.linalg.norm(a2 - r2, axis=1) == 0)
    cos = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(same, 1.0, 0.0))
    return float(np.max(1.0 - cos)) if cos.size else 0.0


def _outside_tol(a: np.ndarray, r: np.ndarray, tol: Tolerances) -> float:
    if not a.size:
        return 0.0
    return float(np.mean(np.abs(a - r) > tol.atol + tol.rtol * np.abs(r)))


def _top1_mismatch(a: np.ndarray, r: np.ndarray, tol: Tolerances) -> float:
    """Fraction of samples whose arg-max over the last axis differs from the reference's."""
    if not a.size:
        return 0.0
    return float(np.mean(np.argmax(a, axis=-1) != np.argmax(r, axis=-1)))


METRICS: dict[str, Callable[[np.ndarray, np.ndarray, Tolerances], float]] = {
    "max_abs": _max_abs,
    "mean_abs": _mean_abs,
    "rms": _rms,
    "cosine": _cosine,
    "outside_tol": _outside_tol,
    "top1_mismatch": _top1_mismatch,
}


def stack(samples: Sequence[Outputs]) -> dict[str, np.ndarray]:
    """Concatenate per-feed outputs along the first (batch) axis, as float64."""
    names = list(samples[0])
    return {
        n: np.concatenate([np.asarray(s[n], dtype=np.float64).reshape(np.shape(s[n]) or (1,)) for s in samples])
        for n in names
    }


def compare(metric: str, outputs: Sequence[Outputs], reference: Sequence[Outputs], tol: Tolerances) -> dict[str, float]:
    """The metric for each output tensor, over all samples given.

    A missing output or a shape mismatch is an infinitely bad result, never an exception: the
    engine is wrong, and the sampler must learn that.
    """
    fn = METRICS[metric]
    got, ref = stack(outputs), stack(reference)
    result: dict[str, float] = {}
    for name, r in ref.items():
        a = got.get(name)
        if a is None or a.shape != r.shape:
            result[name] = float("inf")
            continue
        if not np.all(np.isfinite(a)):
            result[name] = float("inf")
            continue
        result[name] = fn(a, r, tol)
    return result


def worst(per_output: Mapping[str, float]) -> float:
    """The study's accuracy value: the worst output's metric."""
    return max(per_output.values()) if per_output else 0.0
