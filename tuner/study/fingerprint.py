"""What makes two study files compatible: a resumed study must have been created from an equal fingerprint.

A field missing from a stored fingerprint (a study created by an older route-tuner) is unknown and
accepted, so adding a field never makes existing studies refuse to resume; this holds inside
`objective` too (one entry per declared setting, `tuner.objective`). Fingerprints stored before
every setting was declared kept the statistic as `objective` and three settings under `timing`:
`upgraded` reads them in today's form.

The hardware (`DEVICE`: the GPU's name, else the CPU's model) is recorded by the study's first
worker, not from the study file, and every later worker is checked against it (`device_problem`):
timings from two kinds of device are not comparable, so a study refuses a worker on other hardware
unless the study file says `[run] mix_devices = true`.
"""

from __future__ import annotations

from typing import Any

from tuner.measure.inputs import file_hash
from tuner.objective import fingerprint_part
from tuner.space import SearchSpace
from tuner.spec import Spec


def study_fingerprint(
    spec: Spec, space: SearchSpace, data_sha: str, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The facts a study's results depend on, as stored with the study."""
    return {
        "model_sha256": file_hash(spec.model.path),
        "input_shapes": {k: list(v) for k, v in spec.model.inputs.items()},
        "data_sha256": data_sha,
        "direction": "minimize",
        "objective": fingerprint_part(spec.objective),
        **spec.accuracy.settings(),
        "tolerance": spec.accuracy.tolerance,
        "gate_samples": spec.data.gate_samples,
        "work_dir": str(spec.work_dir),
        "backend": spec.backend.name,
        "backend_options": spec.backend.options,
        "space": space.describe(),
        **(extra or {}),
    }


DEVICE = "device"


def device_problem(stored: dict[str, Any], device: str, mix_devices: bool) -> str | None:
    """Why a worker on `device` may not join a study with fingerprint `stored`, or None if it may."""
    recorded = stored.get(DEVICE)
    if recorded is None or recorded == device or mix_devices:
        return None
    return (
        f"the study runs on {recorded!r}, this worker on {device!r}: their timings are not comparable. "
        "Run it on the study's hardware, start a new study ([study] name), or set [run] mix_devices = true"
    )


NESTED = ("objective",)  # compared (and completed) entry by entry


def upgraded(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored fingerprint in today's form (older ones: `objective` the statistic, `timing` three settings)."""
    if "objective" not in stored or isinstance(stored["objective"], dict):
        return dict(stored)
    legacy = {k: v for k, v in stored.items() if k != "timing"}
    legacy["objective"] = {"statistic": stored["objective"], **(stored.get("timing") or {})}
    return legacy


def completed(stored: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """The stored fingerprint (today's form) with what it lacks taken from `current` (checked from then on)."""
    out = {**current, **upgraded(stored)}
    for key in NESTED:
        if isinstance(out.get(key), dict) and isinstance(current.get(key), dict):
            out[key] = {**current[key], **out[key]}
    return out


def differences(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human-readable differences between a stored and a current fingerprint (only keys both have)."""
    stored = upgraded(stored)
    out = []
    for key in sorted(set(stored) & set(current)):
        a, b = stored[key], current[key]
        if a == b:
            continue
        if key in NESTED and isinstance(a, dict) and isinstance(b, dict):
            out += [
                f"{key}.{k}: study has {a[k]!r}, file has {b[k]!r}" for k in sorted(set(a) & set(b)) if a[k] != b[k]
            ]
        elif key == "space" and isinstance(a, dict) and isinstance(b, dict):
            changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            out.append(f"search space differs in {', '.join(changed)}")
        elif key.endswith("sha256"):
            out.append(f"{key.replace('_sha256', '')} bytes differ")
        else:
            out.append(f"{key}: study has {a!r}, file has {b!r}")
    return out
