"""Peak memory while an engine loads and runs: the process's RSS growth on the CPU, device memory on a GPU.

A `MemoryProbe` is started just before a trial's engine is loaded and read after its first inferences
(the quick accuracy gate). On the CPU it resets the kernel's peak-RSS mark of this process
(`/proc/self/clear_refs`, value 5) and reports `VmHWM` minus the RSS at the start: what loading and
running the engine added at its highest. On a GPU it reports the device memory in use after the
inferences minus what was in use at the start (`cudaMemGetInfo`, `tuner.measure.gpu_timing`); that is
device-wide, so it assumes no other process allocates on the GPU meanwhile (one worker per GPU).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tuner.measure.gpu_timing import device_memory_used

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")
MIB = 1 << 20
HOST, DEVICE = "host-rss", "device"


def _status_bytes(field: str) -> int | None:
    """A `kB` field of /proc/self/status in bytes (None where there is no such file)."""
    try:
        found = re.search(rf"^{field}:\s+(\d+) kB", STATUS.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


def _reset_peak() -> bool:
    """Reset this process's peak-RSS mark to its current RSS; False where the kernel does not allow it."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


@dataclass
class MemoryProbe:
    """Readings taken before an engine is loaded; `peak` gives what it added while it ran."""

    host_start: int | None
    host_reset: bool
    device_start: int | None

    @classmethod
    def start(cls) -> MemoryProbe:
        """Take the starting readings (device memory only where this process already uses a CUDA device)."""
        reset = _reset_peak()
        return cls(_status_bytes("VmRSS"), reset, device_memory_used())

    def peak(self, gpu: bool) -> tuple[float | None, str]:
        """(peak growth in MiB or None where it cannot be read, its kind: "host-rss" or "device")."""
        if gpu:
            now = device_memory_used()
            grown = None if now is None or self.device_start is None else now - self.device_start
            return (None if grown is None else round(max(0, grown) / MIB, 3)), DEVICE
        high = _status_bytes("VmHWM") if self.host_reset else None
        grown = None if high is None or self.host_start is None else high - self.host_start
        return (None if grown is None else round(max(0, grown) / MIB, 3)), HOST
