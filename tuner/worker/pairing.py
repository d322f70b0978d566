"""What a trial is timed against: its role, the baseline engine, the incumbent; waited for outside the deadline.

A trial that starts while the study's baseline trial is still running waits for it here, in the
worker, before its child starts: the wait is not the route's time (it is not in the child's
deadline), it happens with the trial's lease beating (`tuner.worker.heartbeat`), under no lock, and
the waiting worker reaps meanwhile, so a baseline whose worker stopped is reaped and re-queued
rather than waited on for ever. The wait ends when the baseline is done (paired with its stored
artifact), has failed, or is only queued with no worker running it (both: timed alone, saying why);
one longer than `wait_s` raises `TimeoutError` (ETIMEDOUT: an environment error, not counted, re-queued).
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.study import racing
from tuner.worker.race import Racer


@dataclass
class Pairing:
    """The pairing of one worker's trials."""

    study: optuna.Study
    racer: Racer
    racing: bool  # [run] racing: pass the incumbent (early stop as `slow`/`ahead`)
    stop: threading.Event
    poll_s: float  # how often a waiting worker looks at the baseline again (and reaps)
    wait_s: float  # the longest wait for the baseline
    reap: Callable[[], object]
    db: Callable[[Callable[[], Any]], Any]  # runs a database read, retried while the database is away

    def for_trial(self, number: int) -> dict[str, Any]:
        """The job's pairing fields for trial `number` (see `tuner.job.Job`), once the baseline is settled."""
        started = time.monotonic()
        while True:
            trials = self.db(lambda: self.study.get_trials(deepcopy=False))
            this = next(t for t in trials if t.number == number)
            if racing.is_baseline(this):
                return {"role": "baseline"}
            pairing = {**self._incumbent(trials), "baseline_wait_s": round(time.monotonic() - started, 4)}
            base = racing.baseline_trial(trials)
            if base is not None:
                return {**pairing, "baseline": self.racer.baseline_engine(base)}
            pending = [t for t in trials if racing.is_baseline(t) and not t.state.is_finished()]
            if not pending:
                return pairing  # no baseline trial, or it failed: timed alone
            if not any(t.state == TrialState.RUNNING for t in pending) or self.stop.is_set():
                return {**pairing, "unpaired": "the baseline trial is queued again, with no worker running it yet"}
            waited = time.monotonic() - started
            if waited >= self.wait_s:
                raise TimeoutError(errno.ETIMEDOUT, f"waited {waited:.0f} s for the baseline trial to finish")
            self.db(self.reap)
            self.stop.wait(self.poll_s)

    def _incumbent(self, trials: list[optuna.trial.FrozenTrial]) -> dict[str, Any]:
        # racing = false: no re-measuring and no early stop as `slow` (every route measured in full, for a landscape)
        if not self.racing:
            return {}
        raced = self.db(lambda: racing.races(self.study))
        return {"incumbent": racing.incumbent(trials, raced), "incumbent_high": racing.incumbent_high(trials, raced)}
