"""One worker: reserve a trial, evaluate its route, tell the outcome; repeat until the budget is spent.

One trial, top to bottom (`Worker.run`, `Worker.evaluate_and_tell`):

1. reap the study's lost trials (`tuner.worker.reap`), then reserve under the study lock: count the
   budget, ask, take the trial's lease (`Worker.reserve`);
2. with the lease beating (`tuner.worker.heartbeat`): suggest the route and evaluate it, invalid,
   known to fail, cached or run in a child (`tuner.worker.evaluate`);
3. tell: record the outcome under the lease, which ends it (`Worker._tell`); an outcome that is not
   the route's doing (interrupted, an environment error) re-queues the route first (`tuner.worker.requeue`);
4. run the after-tell actions in order: the dashboard note, a pause after environment errors, racing
   (`tuner.worker.after_tell`).

The worker waits out database outages of any length (one status line, capped backoff; a finished
child's result is kept and recorded when the database returns), survives child crashes (recorded
with a failure class), and stops cleanly on SIGTERM/SIGINT (`Stop`): the trial in flight is marked
FAIL/interrupted and its route re-queued, so nothing is left RUNNING and nothing half-done is trusted.
A trial reaped while its worker was stopped keeps its worker's late result out (the lease's fence).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import optuna
from optuna.trial import TrialState

from tuner import job as J
from tuner.measure.exclusive import HOST, DeviceLock
from tuner.store.cache import ResultStore
from tuner.store.db import STOP, db_retry, is_db_fault, study_lock
from tuner.store.leases import Fence, LeaseLost, Leases, Owner
from tuner.study import attrs as A
from tuner.study import optuna_adapter as oa
from tuner.study import outcome, racing
from tuner.study.budget import count_trials
from tuner.study.note import update_note
from tuner.study.sampler import make_sampler
from tuner.study.setup import Context
from tuner.worker.after_tell import AfterTell, DashboardNote, EnvironmentPause, RaceLeaders
from tuner.worker.environment import ENV_REQUEUES
from tuner.worker.evaluate import Evaluator
from tuner.worker.heartbeat import Heartbeat
from tuner.worker.isolate import ChildHandle
from tuner.worker.pairing import Pairing
from tuner.worker.race import Racer
from tuner.worker.reap import Reaper
from tuner.worker.requeue import attempt_of, requeue

log = logging.getLogger("tuner.worker")
T = TypeVar("T")


@dataclass
class Stop:
    """Set by a signal handler: finish up and exit."""

    event: threading.Event = field(default_factory=lambda: STOP)  # the process's stop: it also ends database waits
    child: ChildHandle = field(default_factory=ChildHandle)

    def install(self) -> None:
        """Convert SIGTERM and SIGINT into a clean stop that kills the running child; the same signal again exits at
        once (the trial in flight, if any, is left to be reaped: its owner is a dead process on this host).

        Only the same signal: one Ctrl-C reaches a worker twice, as the terminal's SIGINT and as its
        `tuner run`'s SIGTERM, and must still stop it cleanly.
        """
        seen: set[int] = set()

        def handler(signum: int, frame: Any) -> None:  # takes no lock: it may interrupt the main thread anywhere
            if signum in seen:
                os._exit(128 + signum)
            seen.add(signum)
            self.event.set()
            self.child.kill()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


class Worker:
    """The reserve/evaluate/tell loop of one worker process."""

    def __init__(
        self,
        ctx: Context,
        budget: int,
        index: int = 0,
        stop: Stop | None = None,
        child_env: dict[str, str] | None = None,
    ) -> None:
        self.ctx = ctx
        self.spec = ctx.spec
        self.budget = budget
        self.stop = stop or Stop()
        self.name = f"w{index}-{os.getpid()}"
        self.owner = Owner(self.name)
        self.study = ctx.load(make_sampler(self.spec.run, index, ctx.space))
        self.study_id = oa.study_id(self.study)
        self.leases = Leases(ctx.url, self.spec.study)
        self.results = ResultStore(ctx.url)
        self.baseline_value: float | None = None  # the completed baseline trial's value, once read
        run = self.spec.run
        # Held shared while sampling and recording (CPU work): no CPU timing meanwhile; a wait as long as a trial
        # (a stuck holder) goes ahead without it, and so does every wait once the worker is stopping: the trial in
        # flight is recorded at once, not after another process's build and the timing queued behind it.
        self.cores = DeviceLock(HOST, wait_s=run.trial_timeout_s, go_ahead=True, stop=self.stop.event)
        self.reaper = Reaper(ctx, self.study, self.leases)
        self.racer = Racer(ctx, self.study, self.results, self.name, self.stop.child)
        pairing = Pairing(
            self.study,
            self.racer,
            run.racing,
            self.stop.event,
            min(1.0, run.heartbeat_s),
            run.trial_timeout_s,
            self._db,
        )
        self.evaluator = Evaluator(
            ctx,
            self.study,
            self.results,
            pairing,
            self.stop.event,
            self.stop.child,
            child_env or {},
            self._db,
            self.reaper.reap,
        )
        self.after_tell: list[AfterTell] = [
            DashboardNote(self.study, self.cores),
            EnvironmentPause(self.name, self.stop.event, lambda: self._db(self.reaper.reap), run.grace_s),
        ]
        if run.racing:
            self.after_tell.append(RaceLeaders(self.racer, self.stop.event))

    def _db(self, fn: Callable[[], T]) -> T:
        """`fn()` retried until the database answers, however long that takes, or until a stop."""
        for attempt in db_retry():
            with attempt:
                value = fn()
        return value

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> int:
        """Work until the budget is used up (and no other worker's trial may still be re-queued)."""
        done = 0
        try:
            while not self.stop.event.is_set():
                started = time.perf_counter()
                trial, fence, others_running = self._db(self._reap_and_reserve)
                if trial is None or fence is None:
                    if others_running == 0:
                        break
                    self.stop.event.wait(self.spec.run.heartbeat_s)  # others' trials may still be lost and re-queued
                    continue
                if self.stop.event.is_set():  # stopped while reserving: hand the slot back, run nothing
                    self._hand_back(trial, fence)
                    break
                self.evaluate_and_tell(trial, fence, started)
                done += 1
        except Exception as exc:
            if not (self.stop.event.is_set() and is_db_fault(exc)):
                raise
            log.warning("stopped while the database was unreachable; a trial in flight is reaped by the next run")
        return done

    def _reap_and_reserve(self) -> tuple[optuna.Trial | None, Fence | None, int]:
        self.reaper.reap()
        return self.reserve()

    def reserve(self) -> tuple[optuna.Trial | None, Fence | None, int]:
        """Under the study lock: count, and ask only if budget remains. Returns (trial, its lease, running).

        The count is taken again after `ask`: if the lock lapsed meanwhile (its session ended by the
        server) and another worker asked too, the budget would be exceeded, so the trial is handed back
        unrun (`interrupted`, not counted) and the worker counts again next round.
        """
        with self.cores.shared(), study_lock(self.ctx.url, self.spec.study) as held:  # host first, as in `_tell`
            counts = count_trials(self.ctx.url, self.study_id)
            if counts.exhausted(self.budget):
                return None, None, counts.running
            held.check()  # a frozen holder's lock is released by the server: then count again, do not ask
            trial = self.study.ask()
            fence = self.leases.take(oa.trial_id(trial), self.owner)
            over = count_trials(self.ctx.url, self.study_id).over(self.budget)
        if over:
            self._hand_back(trial, fence, "asked for past the budget (another worker took the last slot)")
            return None, None, counts.running + 1
        return trial, fence, counts.running

    def _hand_back(self, trial: optuna.Trial, fence: Fence, why: str = "stopped before it ran") -> None:
        """A reserved trial that will not run: interrupted (not counted), its route re-queued, the note rewritten.

        It ran nothing, so of the after-tell actions only the dashboard note has something to say.
        """
        result = J.Result(status=J.INTERRUPTED, message=f"{why}; re-queued")
        if self._settle(trial, lambda: self._db(lambda: self._tell(trial, result, {}, fence))) is not None:
            update_note(self.study)

    # -- one trial ----------------------------------------------------------------------------

    def evaluate_and_tell(self, trial: optuna.Trial, fence: Fence, started: float) -> None:
        """Suggest the route, evaluate it (cache or child), record the outcome (which ends the lease), then run the
        after-tell actions in order.

        `started` is when this worker began reserving the trial; the time not spent inside the
        child's build/check/time phases is recorded as the tuner's own overhead (`overhead_s`).
        """
        result = self._settle(trial, lambda: self._evaluate_and_tell(trial, fence, started))
        if result is not None:
            for action in self.after_tell:
                action.after_tell(result)

    def _evaluate_and_tell(self, trial: optuna.Trial, fence: Fence, started: float) -> J.Result:
        with Heartbeat(self.leases, fence, self.spec.run.heartbeat_s, self.stop.child.kill_running) as lease:
            route = self._db(lambda: self._on_cores(lambda: self.ctx.space.suggest(trial)))  # sampling reads the study
            result, extra = self.evaluator.evaluate(trial.number, route, lease)
        if self.stop.event.is_set() and result.status in (J.CRASH_SIGNAL, J.CRASH_EXIT, J.TIMEOUT, J.ENVIRONMENT_ERROR):
            result = J.Result(status=J.INTERRUPTED, message="stopped by a signal; re-queued")
        wall = time.perf_counter() - started
        in_child = 0.0 if extra.get(A.CACHE_HIT) else sum(result.phase_s.values())  # a cached result's ran before
        extra.update({A.TRIAL_WALL_S: round(wall, 4), A.OVERHEAD_S: round(wall - in_child, 4)})
        self._db(lambda: self._on_cores(lambda: self._tell(trial, result, extra, fence)))
        return result

    def _settle(self, trial: optuna.Trial, work: Callable[[], T]) -> T | None:
        """`work()`, which writes trial `trial`'s route and result under its lease; None if a reap meanwhile
        discarded it (the lease refuses the result; Optuna refuses a route sampled for the finished trial)."""
        try:
            return work()
        except (LeaseLost, optuna.exceptions.UpdateFinishedTrialError):
            log.warning(
                "trial %d was reaped while this worker was stopped; nothing more of it is recorded", trial.number
            )
            return None

    def _on_cores(self, fn: Callable[[], T]) -> T:
        """`fn()` holding the host lock shared (sampling and recording use the cores); retried by `_db` outside."""
        with self.cores.shared():
            return fn()

    def _tell(self, trial: optuna.Trial, result: J.Result, extra: dict[str, Any], fence: Fence) -> outcome.Judgement:
        """Record the outcome under the lease `fence`; an uncounted one re-queues the route first (both safe to repeat).

        An attempt committed before the connection dropped is not written again; a lease reaped meanwhile
        raises `LeaseLost` (the reaper re-queued the route).
        """
        frozen = oa.storage_of(self.study).get_trial(oa.trial_id(trial))
        env_requeues = int(frozen.user_attrs.get(A.ENV_REQUEUES, 0)) + 1 if result.status == J.ENVIRONMENT_ERROR else 0
        if env_requeues > ENV_REQUEUES:
            log.warning(
                "trial %d: its route met environment errors in %d trials; given up (not re-queued, not counted)",
                frozen.number,
                env_requeues,
            )
        elif result.status in (J.INTERRUPTED, J.ENVIRONMENT_ERROR):
            with study_lock(self.ctx.url, self.spec.study):
                requeue(self.study, frozen, attempt_of(frozen), env_requeues)  # not the route's doing: the same attempt
        attrs = outcome.user_attrs(
            result, self.spec.accuracy.metric, self.spec.accuracy.tolerance, {**extra, A.WORKER: self.name}
        )
        return outcome.record(
            self.study,
            trial,
            result,
            self.spec.accuracy.tolerance,
            self.spec.objective.statistic,
            attrs,
            self._baseline_value(),
            self.spec.objective.max_memory_mb,
            fence,
        )

    def _baseline_value(self) -> float | None:
        """The completed baseline trial's value; read from the study until there is one, then kept (a finished
        trial never changes, and a later baseline trial cannot come before the first completed one)."""
        if self.baseline_value is None:
            base = racing.baseline_trial(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
            self.baseline_value = base.value if base is not None else None
        return self.baseline_value
