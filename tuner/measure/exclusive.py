"""Exclusive timing per device: a host-level reader/writer lock across processes (`fcntl.flock`).

Builds (and everything else a trial's child does on the cores: loading, accuracy checks) hold the
lock *shared*; a timing holds it *exclusive*. So on one host at most one timing runs per device, and
on the CPU no build runs while it times. Devices: `host` (the CPU cores; CPU backends time under it)
and `gpu-<id>` (one per GPU, `<id>` being the first entry of CUDA_VISIBLE_DEVICES, else 0: a
worker pinned with `--gpus` times only against other users of its GPU).

Writers are not starved: each device has two lock files in the lock directory, `<device>.turnstile`
and `<device>.rw`. Everyone passes the turnstile (exclusive) to queue on `rw`; a reader lets go of
the turnstile as soon as it holds `rw` shared, a writer only once it holds `rw` exclusive. A waiting
writer therefore holds the turnstile, new readers queue behind it, and it gets in as soon as the
readers already inside are done. flock locks belong to open file descriptions: they are released
when the holder exits, whatever kills it, so a crashed child never leaves a device locked.

A trial's child starts under a shared hold its worker takes before spawning it and hands down as an
open file descriptor (`STARTUP_HOLD_ENV`, see `tuner.worker.isolate`): the child's Python start-up
(imports, reading feeds and references: a second of a core) never overlaps another worker's timing.
The child adopts that hold as its build's (`shared(adopt=fd)`) rather than queueing again: a second
shared request from a holder could wait behind a queued writer that waits for the first.
The worker itself holds the lock shared while it samples and records trials (Optuna, the database).

The lock directory is $TUNER_LOCK_DIR, else `<tmp>/tuner-locks-<uid>`; every process of one host
that times on the same devices must use the same one. Where it cannot be used the timing goes ahead
and is recorded as not exclusive, with the reason (`Hold`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOCK_DIR_ENV = "TUNER_LOCK_DIR"
STARTUP_HOLD_ENV = "TUNER_STARTUP_HOLD_FD"  # the descriptor of the shared hold a child inherits from its worker
HOST = "host"


def lock_dir() -> Path:
    """The host's lock directory ($TUNER_LOCK_DIR or a per-user directory under the system temp dir)."""
    return Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / f"tuner-locks-{os.getuid()}")


def device_key(gpu: bool) -> str:
    """The lock name of the device a timing uses: `host` for the CPU, `gpu-<id>` for this process's GPU."""
    if not gpu:
        return HOST
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return f"gpu-{''.join(c if c.isalnum() or c in '-_' else '_' for c in visible) or '0'}"


@dataclass
class Hold:
    """What a holder of the lock knows about its hold, recorded with each measurement."""

    device: str
    mode: str  # "shared" or "exclusive"
    held: bool  # False when the lock directory could not be used
    wait_s: float = 0.0
    reason: str = ""
    fd: int = -1  # the held lock's descriptor (-1 when not held): a child started meanwhile may inherit it

    @property
    def exclusive(self) -> bool:
        """The timing really had its device to itself (as far as tuner processes go)."""
        return self.held and self.mode == "exclusive"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        out: dict[str, Any] = {"device": self.device, "exclusive": self.exclusive, "lock_wait_s": round(self.wait_s, 4)}
        if self.reason:
            out["lock_error"] = self.reason
        return out


class DeviceLock:
    """The reader/writer lock of one device on this host."""

    def __init__(self, device: str, directory: Path | None = None) -> None:
        self.device = device
        self.directory = directory or lock_dir()

    def _open(self, suffix: str) -> int:
        self.directory.mkdir(parents=True, exist_ok=True)
        return os.open(self.directory / f"{self.device}.{suffix}", os.O_RDWR | os.O_CREAT, 0o666)

    @contextlib.contextmanager
    def hold(self, mode: str) -> Iterator[Hold]:
        """Hold the lock in `mode` ("shared" or "exclusive") for the duration of the block."""
        start = time.perf_counter()
        try:
            turnstile, rw = self._open("turnstile"), self._open("rw")
        except OSError as exc:
            yield Hold(self.device, mode, False, reason=f"lock directory {self.directory}: {exc.strerror or exc}")
            return
        try:
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            fcntl.flock(rw, fcntl.LOCK_EX if mode == "exclusive" else fcntl.LOCK_SH)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
            yield Hold(self.device, mode, True, time.perf_counter() - start, fd=rw)
        finally:
            os.close(rw)  # closing releases the locks
            os.close(turnstile)

    def shared(self, adopt: int | None = None) -> contextlib.AbstractContextManager[Hold]:
        """Hold the lock shared (builds, loading, accuracy checks).

        `adopt`: the descriptor of a shared hold this process already has (`inherited_startup_hold`):
        it is held on without queueing, and closed at the end of the block.
        """
        return self.hold("shared") if adopt is None else self._adopted(adopt)

    @contextlib.contextmanager
    def _adopted(self, fd: int) -> Iterator[Hold]:
        try:
            yield Hold(self.device, "shared", True, fd=fd)
        finally:
            os.close(fd)

    def exclusive(self) -> contextlib.AbstractContextManager[Hold]:
        """Hold the lock exclusive (a timing)."""
        return self.hold("exclusive")


def inherited_startup_hold() -> int | None:
    """The shared host hold this process's worker handed down (`STARTUP_HOLD_ENV`), kept from the process's own
    children (not inheritable, the variable removed); None when it was started without one."""
    value = os.environ.pop(STARTUP_HOLD_ENV, None)
    if value is None:
        return None
    fd = int(value)
    os.set_inheritable(fd, False)
    return fd


def machine_state() -> dict[str, Any]:
    """The load average (1, 5, 15 min) now, recorded before and after every timing."""
    return {"loadavg": [round(v, 2) for v in os.getloadavg()]}
