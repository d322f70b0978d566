"""The GPU fingerprint, read with nvidia-smi so the worker process never initialises CUDA."""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache
from typing import Any

FIELDS = ("name", "driver_version", "compute_cap", "memory.total")


@cache
def gpu_fingerprint() -> dict[str, Any]:
    """Name, driver, compute capability and memory of the first visible GPU ({} when none is found)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    cmd = [
        smi,
        f"--query-gpu={','.join(FIELDS)}",
        "--format=csv,noheader,nounits",
        *(["-i", visible] if visible else []),
    ]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    if not out:
        return {}
    name, driver, cc, memory = (v.strip() for v in out[0].split(","))
    return {
        "gpu": name,
        "driver": driver,
        "compute_capability": cc,
        "memory_mib": int(float(memory)) if memory.replace(".", "").isdigit() else memory,
    }
