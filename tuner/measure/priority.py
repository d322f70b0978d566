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
With the scheduler's autogroups on (`/proc/sys/kernel/sched_autogroup_enabled`, the default of most
distributions) the CPU is first shared fairly between sessions and a thread's nice counts only inside its
own: so the session's autogroup is raised too (`/proc/self/autogroup`). A trial's child is the leader of
a session of its own (`tuner.worker.forkserver`), so that is the timing process alone; a caller sharing
its session with other processes raises them with it for the block. CPU shares set by cgroups (a
container's or a systemd slice's) are not changed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tuner.measure.cores import threads

TIMING_NICE = -20  # the highest priority a normal (not real-time) thread can have


AUTOGROUP = Path("/proc/self/autogroup")  # "/autogroup-<id> nice <n>": this session's scheduling group


def _autogroup_nice() -> int | None:
    """This session's autogroup nice value, or None without autogroups."""
    try:
        return int(AUTOGROUP.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _set_autogroup(nice: int) -> bool:
    try:
        AUTOGROUP.write_text(str(nice))
    except OSError:
        return False
    return True


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

    The record (`timing_info["priority"]`) has `raised` (bool), `nice` (the value timed at), `autogroup`
    (the session's autogroup nice timed at, None where there are no autogroups) and, when not raised, `why`.
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
    before = {tid: os.getpriority(os.PRIO_PROCESS, tid) for tid in threads()}
    for tid in before:
        _set(tid, TIMING_NICE)
    group = _autogroup_nice()
    group_raised = group is not None and _set_autogroup(TIMING_NICE)
    try:
        yield {"raised": True, "nice": TIMING_NICE, "autogroup": TIMING_NICE if group_raised else None}
    finally:
        if group_raised and group is not None:
            _set_autogroup(group)
        for tid in threads():  # threads started meanwhile inherited `nice`: back to the process's own
            _set(tid, before.get(tid, current))
