"""Tell a machine's transient state (disk full, out of memory, device busy) from a route's own failure.

An `environment-error` says nothing about the route: it is never cached, the trial's child is run
again a bounded number of times (`tuner.worker.evaluate`), its route re-queued a bounded number of
times (`tuner.worker.loop`), and a burst of them pauses the worker (`tuner.worker.after_tell`).
"""

from __future__ import annotations

import errno
import re

from tuner.errors import first_line

# errno values that describe the machine, not the route: space, memory, a busy device, descriptors, a read-only or
# failing disk (EIO), permissions of the work dir or a cache (EACCES), a network file system gone stale or slow.
ENV_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.ENOMEM,
        errno.EBUSY,
        errno.EMFILE,
        errno.ENFILE,
        errno.EROFS,
        errno.EIO,
        errno.EACCES,
        errno.ESTALE,
        errno.ETIMEDOUT,
    }
)

# What native libraries (CUDA, TensorRT, ONNX Runtime, PyTorch) say when memory or the device is taken.
ENV_MESSAGE = re.compile(
    r"out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|failed to allocate memory|"
    r"no space left on device|disk quota exceeded|device or resource busy|busy or unavailable|"
    r"cudaErrorDevicesUnavailable|all CUDA-capable devices are busy",
    re.IGNORECASE,
)

# A child that could not even write its result (its work dir is full) exits with this status (EX_TEMPFAIL).
EXIT_ENVIRONMENT = 75

ENV_ATTEMPTS = 3  # runs of one trial's child before an environment error is given up on (and re-queued)
ENV_BACKOFF_S = 2.0  # wait before the second run; doubled for each further one
ENV_REQUEUES = 2  # times a route is re-queued after environment errors before it is given up
PAUSE_CAP_S = 120.0  # the longest pause of a worker that keeps meeting environment errors


def environment_fault(exc: BaseException) -> str | None:
    """A one-line description if `exc` (or what caused it) is an environment failure, else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MemoryError):
            return f"MemoryError: out of memory {str(current)[:200]}".strip()
        if isinstance(current, OSError) and current.errno in ENV_ERRNOS:
            return (
                f"{type(current).__name__} {errno.errorcode.get(current.errno or 0, '?')}: "
                f"{current.strerror or current}"[:300]
            )
        if ENV_MESSAGE.search(str(current)):
            return f"{type(current).__name__}: {first_line(current)}"[:300]
        current = current.__cause__ or current.__context__
    return None
