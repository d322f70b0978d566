"""What a worker does after each trial it evaluated and told: small actions, run in their list's order.

Each action has one method, `after_tell(result)`, called only once the trial's outcome is recorded
(a trial reaped meanwhile, whose late result was discarded, runs none). A worker's list
(`tuner.worker.loop.Worker.after_tell`) is, in order:

- `DashboardNote`: the study note optuna-dashboard shows (the verdict and the best feasible trial);
- `EnvironmentPause`: after an environment error, a pause instead of burning budget;
- `RaceLeaders` (with `[run] racing`): close leaders re-measured before more budget is asked for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import optuna

from tuner import job as J
from tuner.measure.exclusive import DeviceLock
from tuner.study.note import update_note
from tuner.worker.environment import ENV_ATTEMPTS, ENV_BACKOFF_S, PAUSE_CAP_S
from tuner.worker.race import Racer

log = logging.getLogger("tuner.worker")


class AfterTell(Protocol):
    """An action run after a trial's outcome is recorded."""

    def after_tell(self, result: J.Result) -> None:
        """React to the trial that ended with `result`."""


@dataclass
class DashboardNote:
    """Rewrite the study note (never raises), holding the host's cores shared: no CPU timing meanwhile."""

    study: optuna.Study
    cores: DeviceLock

    def after_tell(self, result: J.Result) -> None:
        """Rewrite the note from the trials as they are now."""
        with self.cores.shared():
            update_note(self.study)


@dataclass
class EnvironmentPause:
    """After an environment error, pause (doubling, capped) instead of burning budget; say so once.

    A paused worker is still a live one: every `reap_every_s` of its pause it reaps the trials of workers that
    stopped (`reap`), so a stopped worker's trial is re-queued even while every other worker is paused.
    """

    worker: str  # the worker's name, in the lines it logs
    stop: threading.Event  # ends a pause
    reap: Callable[[], object]  # re-queues the trials of stopped workers (`tuner.worker.reap.Reaper.reap`)
    reap_every_s: float  # how often it reaps while paused (the run's grace_s)
    streak: int = field(default=0, init=False)  # trials in a row that ended in an environment error

    def after_tell(self, result: J.Result) -> None:
        """Pause if `result` is an environment error; otherwise end the streak."""
        if result.status != J.ENVIRONMENT_ERROR:
            if self.streak:
                log.warning("environment errors cleared; worker %s resumes", self.worker)
            self.streak = 0
            return
        self.streak += 1
        pause = min(PAUSE_CAP_S, ENV_BACKOFF_S * 2 ** (ENV_ATTEMPTS + self.streak - 2))
        if self.streak == 1:
            log.warning(
                "worker %s paused: %s (%d runs in a row); the trial is re-queued, nothing is cached; "
                "retrying every <= %g s until the machine recovers",
                self.worker,
                result.message,
                ENV_ATTEMPTS,
                PAUSE_CAP_S,
            )
        ends = time.monotonic() + pause
        while (left := ends - time.monotonic()) > 0 and not self.stop.wait(min(left, self.reap_every_s)):
            self.reap()


@dataclass
class RaceLeaders:
    """Re-measure close leaders (`tuner.worker.race`) before the worker asks for more budget."""

    racer: Racer
    stop: threading.Event  # a stopped worker races no more

    def after_tell(self, result: J.Result) -> None:
        """Race what `tuner.study.racing.to_race` picks now, unless the worker is stopping."""
        if not self.stop.is_set():
            self.racer.race()
