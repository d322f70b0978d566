"""Device fingerprints shared by the backends: what a cached result depends on besides the route."""

from __future__ import annotations

import os
import platform
from functools import cache
from typing import Any


@cache
def cpu_fingerprint() -> dict[str, Any]:
    """CPU model, logical core count and OS, read once per process."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count() or 1, "os": platform.system(), "machine": platform.machine()}


def hardware(device: dict[str, Any]) -> str:
    """The hardware a device fingerprint describes, for telling hosts apart: its GPU's name, else its CPU's model."""
    return str(device.get("gpu") or device.get("cpu") or device.get("machine") or "unknown")
