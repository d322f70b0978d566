"""Tie a process's life to its parent's: Linux `PR_SET_PDEATHSIG` through ctypes.

A worker's child (and a `tuner run`'s worker) must not outlive the process that started it: after a
`kill -9` of the parent, the kernel sends the chosen signal to the child.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PARENT_ENV = "TUNER_PARENT_PID"  # the pid the child expects as its parent (set by whoever starts it)
STARTER_ENV = "TUNER_STARTER_PID"  # a child forked by a server (tuner.worker.forkserver): the process that asked for it


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` when the parent dies; exit now if it already has.

    The expected parent comes from $TUNER_PARENT_PID: if the parent died before the request was in
    place, this process has been re-parented already and exits at once. No-op off Linux.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    expected = os.environ.get(PARENT_ENV)
    if expected and int(expected) != os.getppid():
        os._exit(1)  # the parent is gone already: nobody is waiting for this process
