"""Keep one core busy with another process, as other work on a shared host does (bench/load.py, bench/aa.py --busy).

The busy process is a plain Python loop in its own interpreter (not a tuner process, so the host
timing lock does not keep it out); it runs until the block ends and is then killed by its pid, and it
dies with the benchmark that started it when that is stopped by a signal (`PR_SET_PDEATHSIG`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.worker.lifeline import PARENT_ENV

REPO = Path(__file__).resolve().parents[1]
SPIN = "from tuner.worker.lifeline import die_with_parent\ndie_with_parent()\nwhile True:\n    pass\n"


@dataclass
class Busy:
    """The running busy process."""

    proc: subprocess.Popen[bytes]
    started: float

    def cpu_s(self) -> float:
        """CPU seconds it has used so far (from /proc)."""
        fields = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def describe(self) -> dict[str, Any]:
        """What it did: its CPU time over its wall time (1.0 = a whole core)."""
        wall = time.monotonic() - self.started
        return {
            "what": "one Python process spinning (bench/busy.py)",
            "wall_s": round(wall, 1),
            "cores_used": round(self.cpu_s() / wall, 3) if wall > 0 else None,
        }


@contextlib.contextmanager
def busy_core() -> Iterator[Busy]:
    """Run a process that keeps one core busy for the duration of the block."""
    env = {**os.environ, "PYTHONPATH": str(REPO), PARENT_ENV: str(os.getpid())}
    proc = subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL, env=env)
    busy = Busy(proc, time.monotonic())
    try:
        yield busy
    finally:
        proc.kill()
        proc.wait()
