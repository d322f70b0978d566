"""The heartbeat of a running trial's lease, as a context manager around the trial (as Optuna's `_optimize` has).

A thread refreshes the lease every `heartbeat_s` seconds (`tuner.store.leases.Leases.beat`) from the
moment the trial is reserved until it is told, so every wait a trial makes (for the baseline, for a
lock, for its child) happens with its lease alive. A missed beat is tried again next period; the
grace period covers a few.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType

from tuner.store.db import OUTAGE, is_db_fault
from tuner.store.leases import Leases

log = logging.getLogger("tuner.worker")


class Heartbeat:
    """Beat the lease of trial `trial_id` while the block runs."""

    def __init__(self, leases: Leases, trial_id: int, every_s: float) -> None:
        self.leases, self.trial_id, self.every_s = leases, trial_id, every_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"heartbeat-{trial_id}")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(self.every_s):
            try:
                self.leases.beat(self.trial_id)
            except Exception as exc:
                if is_db_fault(exc):
                    OUTAGE.failed(exc)
                else:
                    log.warning("heartbeat failed: %s", type(exc).__name__)
            else:
                OUTAGE.recovered()
