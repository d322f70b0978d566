"""The heartbeat of a running trial's lease, as a context manager around the trial (as Optuna's `_optimize` has).

The worker's `with` spans one trial's suggestion and evaluation (`tuner.worker.loop.Worker.evaluate_and_tell`);
as in Optuna, the tell follows the block, and its write ends the lease. A thread refreshes the lease
every `heartbeat_s` seconds (`tuner.store.leases.Leases.beat`) meanwhile, so every wait a trial
makes (for the baseline, for a lock, for its child) happens with its lease alive. A missed beat is
tried again next period; the grace period covers a few. A beat that finds the lease no longer its
own (reaped while this process was stopped) stops beating; the trial's writes are then refused by
its fence.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType

from tuner.store.db import OUTAGE, is_db_fault
from tuner.store.leases import Fence, Leases

log = logging.getLogger("tuner.worker")


class Heartbeat:
    """Beat the lease `fence` while the block runs."""

    def __init__(self, leases: Leases, fence: Fence, every_s: float) -> None:
        self.leases, self.fence, self.every_s = leases, fence, every_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"heartbeat-{fence.trial_id}")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(self.every_s):
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
                    return
