"""What makes two study files compatible: a resumed study must have been created from an equal fingerprint.

A field missing from a stored fingerprint (a study created by an older route-tuner) is unknown and
accepted, so adding a field never makes existing studies refuse to resume.
"""

from __future__ import annotations

from typing import Any

from tuner.measure.inputs import file_hash
from tuner.space import SearchSpace
from tuner.spec import Spec


def study_fingerprint(spec: Spec, space: SearchSpace, data_sha: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The facts a study's results depend on, as stored with the study."""
    return {
        "model_sha256": file_hash(spec.model.path),
        "input_shapes": {k: list(v) for k, v in spec.model.inputs.items()},
        "data_sha256": data_sha,
        "direction": "minimize",
        "objective": spec.objective.statistic,
        "metric": spec.accuracy.metric,
        "tolerance": spec.accuracy.tolerance,
        "atol": spec.accuracy.atol,
        "rtol": spec.accuracy.rtol,
        "gate_samples": spec.data.gate_samples,
        "timing": {"warmup_s": spec.objective.warmup_s, "min_repeats": spec.objective.min_repeats,
                   "min_duration_s": spec.objective.min_duration_s},
        "work_dir": str(spec.work_dir),
        "backend": spec.backend.name,
        "backend_options": spec.backend.options,
        "space": space.describe(),
        **(extra or {}),
    }


def differences(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human-readable differences between a stored and a current fingerprint (only keys both have)."""
    out = []
    for key in sorted(set(stored) & set(current)):
        a, b = stored[key], current[key]
        if a == b:
            continue
        if key == "space" and isinstance(a, dict) and isinstance(b, dict):
            changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            out.append(f"search space differs in {', '.join(changed)}")
        elif key.endswith("sha256"):
            out.append(f"{key.replace('_sha256', '')} bytes differ")
        else:
            out.append(f"{key}: study has {a!r}, file has {b!r}")
    return out
