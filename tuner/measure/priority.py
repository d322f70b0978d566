"""Exclusive timing against other work on the host: the timing process's threads at raised priority.

The host timing lock (`tuner.measure.exclusive`) keeps other tuner processes out, nothing else; a
process of someone else's keeping a core busy slows a two-thread session far more than a one-thread
one, and pairing does not cancel that (`tuner.measure.contention`). Under `[objective] contention =
"exclusive"` a timing therefore runs with every thread of its process at nice TIMING_NICE, where the
process may (root, CAP_SYS_NICE, or an RLIMIT_NICE of 40): the
scheduler then gives other work at normal priority about 1 % of a core the timing wants, for the
length of the timing (at most `timing_cap_s` per measurement). The previous nice values are restored
afterwards. Where raising is not permitted nothing changes and the contention probe does its job alone.

On Linux a nice value belongs to a thread (`setpriority(PRIO_PROCESS, tid)`), and a thread started later
inherits its starter's: every thread in /proc/self/task is set, so ONNX Runtime's pool threads are too.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TIMING_NICE = -20  # the highest priority a normal (not real-time) thread can have


def _threads() -> list[int]:
    tasks = Path("/proc/self/task")
    return [int(p.name) for p in tasks.iterdir()] if tasks.is_dir() else [0]


def _set(tid: int, nice: int) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    except ProcessLookupError:  # a thread that ended meanwhile
        pass


def _may_raise() -> bool:
    """Whether this thread may take TIMING_NICE (tried, then put back)."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, TIMING_NICE)
    except PermissionError:
        return False
    os.setpriority(os.PRIO_PROCESS, 0, current)
    return True


@contextlib.contextmanager
def raised(enabled: bool = True) -> Iterator[dict[str, Any]]:
    """Every thread of this process at TIMING_NICE for the block, where permitted; what was done, as a record.

    The record (`timing_info["priority"]`) has `raised` (bool), `nice` (the value timed at) and, when
    not raised, `why`.
    """
    if not enabled:
        yield {"raised": False, "why": "not asked for (contention = 'shared', or a replayed runner)"}
        return
    if not hasattr(os, "setpriority") or not Path("/proc/self/task").is_dir():
        yield {"raised": False, "why": "thread priorities cannot be set on this platform"}
        return
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if not _may_raise():
        yield {"raised": False, "nice": current, "why": "not permitted (needs root, CAP_SYS_NICE or RLIMIT_NICE 40)"}
        return
    before = {tid: os.getpriority(os.PRIO_PROCESS, tid) for tid in _threads()}
    for tid in before:
        _set(tid, TIMING_NICE)
    try:
        yield {"raised": True, "nice": TIMING_NICE}
    finally:
        for tid in _threads():  # threads started meanwhile inherited `nice`: back to the process's own
            _set(tid, before.get(tid, current))
