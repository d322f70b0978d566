"""What a benchmark's figures were measured on, and at which commit: recorded beside every result it writes."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def describe() -> dict[str, Any]:
    """The machine now: its CPUs (machines of one kind differ in their CPU model: it is named), platform,
    interpreter and load average."""
    from tuner.backends.device import cpu_fingerprint

    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_fingerprint()["cpu"],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg": list(os.getloadavg()),
    }


def commit(rev: str = "HEAD") -> str:
    """The commit `rev` names (short; the checked-out one by default), marked `+dirty` when it is the checked-out
    one and the tree has changes."""
    head = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True).stdout.strip()
    if rev != "HEAD":
        return head
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return head + ("+dirty" if dirty else "")
