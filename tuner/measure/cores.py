"""`[objective] cores = k`: the deployment's share of the machine, as CPU affinity of the trial's child.

`pin(k)` restricts every thread of this process (and so every thread it starts later: ONNX Runtime's
and Inductor's pools are made after it) to the first k cores it may use, before anything is built
or loaded; `allowed()` is what a timing records of where it ran (`timing_info["affinity"]`).
"""

from __future__ import annotations

import os
from pathlib import Path


def allowed() -> list[int]:
    """The cores this thread may run on, in order."""
    return sorted(os.sched_getaffinity(0))


def threads() -> list[int]:
    """The ids of this process's threads (Linux), else [0]: the calling thread."""
    tasks = Path("/proc/self/task")
    return [int(p.name) for p in tasks.iterdir()] if tasks.is_dir() else [0]


def pin(k: int) -> list[int]:
    """Pin every thread of this process to its first `k` allowed cores; those cores."""
    cores = allowed()[:k]
    for tid in threads():
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
    os.sched_setaffinity(0, cores)
    return cores
