"""What a trial is timed against: its role, the baseline engine, the incumbent; waited for outside the deadline.

A trial that starts while the study's baseline trial is still running has its child started at once:
the child builds, loads and gates its route while the worker waits for the baseline here, in a thread,
and hands the pairing over once it is settled (`Pairing.handed_over`, `tuner.worker.handover`); the
child waits for it only before its timing. The wait is not the route's time (the child reports it and
the deadline moves), it happens with the trial's lease beating (`tuner.worker.heartbeat`), under no
lock, and the worker reaps meanwhile (`tuner.worker.reap.reaping`), so a baseline whose worker stopped
is reaped and re-queued rather than waited on for ever. The wait ends when the baseline is done (paired
with its stored artifact), has failed, or is only queued with no worker running it (both: timed alone,
saying why); one longer than `wait_s` ends the trial as an `environment-error` (ETIMEDOUT: not counted,
re-queued).
"""

from __future__ import annotations

import contextlib
import errno
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.study import racing
from tuner.worker.handover import hand_over, waiting
from tuner.worker.isolate import ChildHandle
from tuner.worker.race import Racer

WAITING_POLL_S = 0.1  # how often the study is looked at while the trial's child waits for the baseline


@dataclass
class Handover:
    """How handing a trial's pairing over to its running child went (`Pairing.handed_over`)."""

    timed_out: bool = False  # the baseline took longer than `Pairing.wait_s`: the child ended as an environment error
    error: BaseException | None = None


@dataclass
class Pairing:
    """The pairing of one worker's trials."""

    study: optuna.Study
    racer: Racer
    racing: bool  # [run] racing: pass the incumbent (early stop as `slow`/`ahead`)
    stop: threading.Event
    poll_s: float  # how often a waiting worker looks at the baseline again
    wait_s: float  # the longest wait for the baseline
    db: Callable[[Callable[[], Any]], Any]  # runs a database read, retried while the database is away

    def settled(self, number: int) -> dict[str, Any] | None:
        """The job's pairing fields for trial `number` (see `tuner.job.Job`) if the baseline is settled, else None
        (the baseline trial is running)."""
        trials = self.db(lambda: self.study.get_trials(deepcopy=False))
        this = next(t for t in trials if t.number == number)
        if racing.is_baseline(this):
            return {"role": "baseline"}
        base = racing.baseline_trial(trials)
        if base is not None:
            return {**self._incumbent(trials), "baseline": self.racer.baseline_engine(base)}
        pending = [t for t in trials if racing.is_baseline(t) and not t.state.is_finished()]
        if not pending:
            return self._incumbent(trials)  # no baseline trial, or it failed: timed alone
        if not any(t.state == TrialState.RUNNING for t in pending) or self.stop.is_set():
            return {
                **self._incumbent(trials),
                "unpaired": "the baseline trial is queued again, with no worker running it yet",
            }
        return None

    def _settled_within(
        self, number: int, ended: threading.Event, waiting: Callable[[], bool]
    ) -> dict[str, Any] | None:
        """Trial `number`'s pairing fields once the baseline is settled, looked for every `poll_s`, or every
        `WAITING_POLL_S` while `waiting()` (the child waits for them); None if `ended` is set first (the child is
        gone); `TimeoutError` (ETIMEDOUT) after `wait_s`."""
        started = looked = time.monotonic()
        pairing = self.settled(number)
        while pairing is None:
            if ended.wait(WAITING_POLL_S):
                return None
            now = time.monotonic()
            if now - started >= self.wait_s:
                raise TimeoutError(errno.ETIMEDOUT, f"waited {now - started:.0f} s for the baseline trial to finish")
            if now - looked >= self.poll_s or waiting():
                looked, pairing = now, self.settled(number)
        return pairing

    @contextlib.contextmanager
    def handed_over(self, number: int, path: Path, result_path: Path, child: ChildHandle) -> Iterator[Handover]:
        """While the block runs trial `number`'s child (writing `result_path`), wait for the baseline in a thread
        and hand the child its pairing through `path` (`tuner.worker.handover`). A wait that runs out is handed over
        as an error (the child ends as an `environment-error`; `Handover.timed_out`); anything else the wait raises
        is handed over as an error too and raised here once the block is done; a hand-over that cannot be written
        (a full disk) kills the child (an `environment-error`)."""
        path.unlink(missing_ok=True)
        ended, state = threading.Event(), Handover()

        def wait_and_hand_over() -> None:
            try:
                fields = self._settled_within(number, ended, lambda: waiting(result_path))
            except TimeoutError as exc:
                state.timed_out, fields = True, {"error": str(exc.strerror or exc)}
            except BaseException as exc:  # a stop during an outage: raised in the worker's thread
                state.error, fields = exc, {"error": f"the worker could not read the baseline ({type(exc).__name__})"}
            if fields is None:
                return
            try:
                hand_over(path, fields)
            except OSError:  # the child would wait in vain
                child.kill_running()

        thread = threading.Thread(target=wait_and_hand_over, daemon=True, name="pairing")
        thread.start()
        try:
            yield state
        finally:
            ended.set()
            thread.join()
            path.unlink(missing_ok=True)
        if state.error is not None:
            raise state.error

    def _incumbent(self, trials: list[optuna.trial.FrozenTrial]) -> dict[str, Any]:
        # racing = false: no re-measuring and no early stop as `slow` (every route measured in full, for a landscape)
        if not self.racing:
            return {}
        raced = self.db(lambda: racing.races(self.study))
        return {"incumbent": racing.incumbent(trials, raced), "incumbent_high": racing.incumbent_high(trials, raced)}
