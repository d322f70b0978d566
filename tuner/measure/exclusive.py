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

The lock directory is $TUNER_LOCK_DIR, else `$XDG_RUNTIME_DIR/tuner-locks`, else `<tmp>/tuner-locks-<uid>`;
every process of one host that times on the same devices must use the same one. It is private: created
0700, used only if it is a real directory (not a link) owned by this user (a looser mode is tightened),
its files opened 0600 with `O_NOFOLLOW`, so no other local user can hold a device. Where it cannot be
used the timing goes ahead and is recorded as not exclusive, with the reason (`Hold`).

Waits are bounded where the caller says so (`wait_s`): a lock not had by then raises `LockWaitExpired`
(an `ETIMEDOUT` error, which `tuner.worker.environment` classes as the machine's, not the route's), and so
does a wait whose caller's `stop` event is set (a worker told to stop records its trial in flight at once,
not after another process's build and the timing queued behind it). A
process that reports its waits (`report_waits`) writes how long it has waited so far to a small file,
so its worker can keep waits out of the trial's deadline (`tuner.worker.isolate`); a wait for something
other than a lock that is not the route's time either is reported the same way (`reported_wait`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOCK_DIR_ENV = "TUNER_LOCK_DIR"
STARTUP_HOLD_ENV = "TUNER_STARTUP_HOLD_FD"  # the descriptor of the shared hold a child inherits from its worker
HOST = "host"
STOP_POLL_S = 0.1  # how often a stoppable wait looks at its stop event


def lock_dir() -> Path:
    """The host's lock directory ($TUNER_LOCK_DIR, else private per-user directory; see the module docstring)."""
    explicit = os.environ.get(LOCK_DIR_ENV)
    if explicit:
        return Path(explicit)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "tuner-locks"
    return Path(tempfile.gettempdir()) / f"tuner-locks-{os.getuid()}"


def private_dir(directory: Path) -> None:
    """Create `directory` 0700 if missing; raise PermissionError unless it is a real directory of this user.

    A directory of this user with a looser mode is tightened to 0700.
    """
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(errno.EACCES, "not a directory (a link?); refusing to use it", str(directory))
    if st.st_uid != os.getuid():
        raise PermissionError(
            errno.EACCES, f"owned by uid {st.st_uid}, not this user; refusing to use it", str(directory)
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(directory, 0o700)


class LockWaitExpired(TimeoutError):
    """A lock was not had within the wait allowed (the machine's state, never the route's failure)."""

    def __init__(self, what: str, waited_s: float) -> None:
        super().__init__(errno.ETIMEDOUT, f"waited {waited_s:.0f} s for the {what} lock (held by another process)")


class _WaitLog:
    """This process's waits: their total, the most allowed for locks in all, and the file they are reported to
    ({"waited_s": total so far, "since": monotonic start of the wait going on, or null})."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.waited_s = 0.0  # for locks
        self.other_s = 0.0  # for anything else that is not the route's time (`reported_wait`)
        self.limit_s: float | None = None  # the most this process waits for locks in all (None: no bound)

    def allowance(self, wait_s: float | None) -> float | None:
        """How long the next wait may last: `wait_s`, within what is left of the process's limit."""
        left = None if self.limit_s is None else max(0.0, self.limit_s - self.waited_s)
        return left if wait_s is None else wait_s if left is None else min(wait_s, left)

    def write(self, since: float | None) -> None:
        if self.path is None:
            return
        with contextlib.suppress(OSError):  # a report that cannot be written only shortens the deadline's allowance
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"waited_s": self.waited_s + self.other_s, "since": since}))
            tmp.replace(self.path)


WAITS = _WaitLog()


def report_waits(path: Path, limit_s: float | None) -> None:
    """From now on, record this process's lock waits in `path` (read with `waited`); wait `limit_s` at most in all."""
    WAITS.path, WAITS.limit_s = path, limit_s
    WAITS.write(None)


@contextlib.contextmanager
def reported_wait() -> Iterator[None]:
    """A wait of this process that is neither the route's time nor a lock's (a trial's child waiting for the
    baseline's engine): reported as waits are, so its worker's deadline moves, but not counted in the lock limit."""
    start = time.monotonic()
    WAITS.write(start)
    try:
        yield
    finally:
        WAITS.other_s += time.monotonic() - start
        WAITS.write(None)


def waited(path: Path, now: float) -> float:
    """Seconds the process reporting to `path` has spent waiting (for locks, or `reported_wait`) up to monotonic
    time `now`."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0.0
    since = data.get("since")
    return float(data.get("waited_s", 0.0)) + (max(0.0, now - float(since)) if since is not None else 0.0)


def flock_within(fd: int, flags: int, wait_s: float | None, what: str, stop: threading.Event | None = None) -> float:
    """`flock(fd, flags)`, waiting at most `wait_s` seconds (None: as long as it takes) and, with `stop`, only until
    it is set (then `LockWaitExpired`); the seconds waited.

    The wait blocks in the kernel (a waiter is listed in /proc/locks); a bounded or stoppable one blocks in a
    thread on a duplicate of `fd`, and one given up on leaves that thread to drop the lock as soon as it gets it.
    The wait is reported (`WAITS`).
    """
    try:
        fcntl.flock(fd, flags | fcntl.LOCK_NB)
        return 0.0
    except BlockingIOError:
        pass
    start = time.monotonic()
    WAITS.write(start)
    try:
        if wait_s is None and stop is None:
            fcntl.flock(fd, flags)
        else:
            _BoundedFlock(fd, flags).wait(math.inf if wait_s is None else wait_s, what, stop)
        return time.monotonic() - start
    finally:
        WAITS.waited_s += time.monotonic() - start
        WAITS.write(None)


class _BoundedFlock:
    """A blocking flock in a thread, on a duplicate of the descriptor (the lock belongs to the shared open file)."""

    def __init__(self, fd: int, flags: int) -> None:
        self.dup, self.flags = os.dup(fd), flags
        self.mutex, self.done = threading.Lock(), threading.Event()
        self.got = self.abandoned = False
        self.error: OSError | None = None
        threading.Thread(target=self._run, daemon=True, name="lock-wait").start()

    def _run(self) -> None:
        try:
            fcntl.flock(self.dup, self.flags)
        except OSError as exc:
            self.error = exc
        with self.mutex:
            self.got = self.error is None
            if self.abandoned:  # nobody wants it any more: the last descriptor closes, and the lock goes with it
                os.close(self.dup)
        self.done.set()

    def wait(self, wait_s: float, what: str, stop: threading.Event | None = None) -> None:
        start = time.monotonic()
        if stop is None:
            self.done.wait(wait_s)
        else:
            end = start + wait_s
            while not (stop.is_set() or self.done.wait(min(STOP_POLL_S, max(0.0, end - time.monotonic())))):
                if time.monotonic() >= end:
                    break
        with self.mutex:
            if not self.got and self.error is None:
                self.abandoned = True
                raise LockWaitExpired(what, time.monotonic() - start)
        os.close(self.dup)  # the caller's descriptor holds the lock on
        if self.error is not None:
            raise self.error


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

    def __init__(
        self,
        device: str,
        directory: Path | None = None,
        wait_s: float | None = None,
        go_ahead: bool = False,
        stop: threading.Event | None = None,
    ) -> None:
        self.device = device
        self.directory = directory or lock_dir()
        self.wait_s = wait_s  # the longest wait (None: as long as the process's limit allows); then LockWaitExpired
        self.go_ahead = go_ahead  # a wait that expires goes ahead unheld (`Hold.held` False) instead of raising
        self.stop = stop  # once set, a wait ends as one that expired (a stopping process does not queue)

    def _open(self, suffix: str) -> int:
        private_dir(self.directory)
        return os.open(self.directory / f"{self.device}.{suffix}", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)

    @contextlib.contextmanager
    def hold(self, mode: str) -> Iterator[Hold]:
        """Hold the lock in `mode` ("shared" or "exclusive") for the duration of the block (see `wait_s`)."""
        start = time.perf_counter()
        try:
            turnstile = self._open("turnstile")
            try:
                rw = self._open("rw")
            except OSError:
                os.close(turnstile)
                raise
        except OSError as exc:
            yield Hold(self.device, mode, False, reason=f"lock directory {self.directory}: {exc.strerror or exc}")
            return
        try:
            try:
                spent = flock_within(turnstile, fcntl.LOCK_EX, WAITS.allowance(self.wait_s), self.device, self.stop)
                flock_within(
                    rw,
                    fcntl.LOCK_EX if mode == "exclusive" else fcntl.LOCK_SH,
                    WAITS.allowance(None if self.wait_s is None else max(0.0, self.wait_s - spent)),
                    self.device,
                    self.stop,
                )
                expired = ""
            except LockWaitExpired as exc:
                if not self.go_ahead:
                    raise
                expired = str(exc)
            if expired:
                yield Hold(self.device, mode, False, time.perf_counter() - start, reason=expired)
                return
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
