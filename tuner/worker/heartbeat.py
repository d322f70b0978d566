"""The heartbeat of a running trial's lease, as a context manager around the trial (as Optuna's `_optimize` has).

The worker's `with` spans one trial's suggestion and evaluation (`tuner.worker.loop.Worker.evaluate_and_tell`);
as in Optuna, the tell follows the block, and its write ends the lease. A thread refreshes the lease
every `heartbeat_s` seconds (`tuner.store.leases.Leases.beat`) meanwhile, so every wait a trial
makes (for the baseline, for a lock, for its child) happens with its lease alive. A missed beat is
tried again next period; the grace period covers a few. A beat that finds the lease no longer its
own (reaped while this process was stopped) stops beating, sets `lost` and calls `on_lost` (the
worker kills the trial's child: its route was re-queued and runs elsewhere); the trial's writes are
then refused by its fence. Before a child starts, `held` beats at once: a worker that resumes after
its trial was reaped starts no child for it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

from tuner.store.db import OUTAGE, is_db_fault
from tuner.store.leases import Fence, Leases

log = logging.getLogger("tuner.worker")


class Heartbeat:
    """Beat the lease `fence` while the block runs; `lost` is set once a beat finds it reaped."""

    def __init__(
        self, leases: Leases, fence: Fence, every_s: float, on_lost: Callable[[], None] = lambda: None
    ) -> None:
        self.leases, self.fence, self.every_s, self.on_lost = leases, fence, every_s, on_lost
        self.lost = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"heartbeat-{fence.trial_id}")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._done.set()
        self._thread.join()

    def held(self) -> bool:
        """Whether the lease is still this trial's, beaten now. Only a beat that finds it reaped says no: a database
        that does not answer leaves the question to the next beat."""
        if not self.lost.is_set():
            self._beat()
        return not self.lost.is_set()

    def _run(self) -> None:
        while not self._done.wait(self.every_s) and not self.lost.is_set():
            self._beat()

    def _beat(self) -> None:
        try:
            held = self.leases.beat(self.fence)
        except Exception as exc:
            if is_db_fault(exc):
                OUTAGE.failed(exc)
            else:
                log.warning("heartbeat failed: %s", type(exc).__name__)
        else:
            OUTAGE.recovered()
            if not held:
                self.lost.set()
                self.on_lost()
