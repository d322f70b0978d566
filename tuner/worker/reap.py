"""Reap trials whose worker is gone: fail them as `lost` and re-queue their routes, or give a route up.

Any live worker reaps, before each reservation, while it waits for the baseline (`tuner.worker.pairing`)
and while its trial's child runs (`reaping`: a child may wait long for a host lock that a stopped worker
holds, and that worker's trial must not go unreaped meanwhile). A RUNNING trial is lost when its lease's
heartbeat is older than `grace_s`, its owner is a dead process on this host, or it ran past its deadline
(`tuner.store.leases`). The reap is claimed under the study lock, which bumps the lease's epoch, so the
lost owner's late writes are refused; the route is re-queued first, then the trial failed, both safe to
repeat. A route lost in `[run] max_attempts` runs is failed as `given-up` (counted) instead, once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

import optuna
from optuna.trial import TrialState

from tuner import job as J
from tuner.store.db import RETRY_CAP_S, is_db_fault, study_lock
from tuner.store.leases import Fence, Leases
from tuner.study import optuna_adapter as oa
from tuner.study import outcome
from tuner.study.setup import Context
from tuner.worker.requeue import attempt_of, requeue, route_of

log = logging.getLogger("tuner.worker")


class Reaper:
    """One worker's reaping of the study's lost trials."""

    def __init__(self, ctx: Context, study: optuna.Study, leases: Leases) -> None:
        self.ctx, self.spec, self.study, self.leases = ctx, ctx.spec, study, leases

    def reap(self) -> list[int]:
        """Fail and re-queue RUNNING trials whose owner is gone or whose deadline passed. Returns their numbers.

        A route lost in `run.max_attempts` runs is failed instead (`given-up`, counted), once.
        """
        run = self.spec.run
        storage = oa.storage_of(self.study)
        running = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
        # Right after an outage every heartbeat is stale: trust only dead PIDs until live workers have beaten again.
        # A live worker waiting in a retried call notices the database back up to RETRY_CAP_S after this one did
        # (its backoff; 3 s later in a real run), so the window is that beyond the grace period. The leases ask
        # when the database answers them: an outage may begin during this reap, and their calls wait it out.
        distrust_s = run.grace_s + RETRY_CAP_S
        lost = self.leases.expired([oa.trial_id(t) for t in running], run.grace_s, run.deadline_s, distrust_s)
        reaped = []
        if not lost:
            return reaped
        with study_lock(self.ctx.url, self.spec.study):
            for trial_id in lost:
                frozen = storage.get_trial(trial_id)
                if frozen.state != TrialState.RUNNING:
                    continue
                # its owner now writes nothing
                fence = self.leases.claim_reap(trial_id, run.grace_s, run.deadline_s, distrust_s)
                if fence is None:
                    continue
                self._fail_lost(frozen, fence)
                reaped.append(frozen.number)
        return reaped

    def _fail_lost(self, frozen: optuna.trial.FrozenTrial, fence: Fence) -> None:
        """A reaped trial: `lost` and its route re-queued, or `given-up` (counted) after `run.max_attempts` runs.

        Re-queued first, then failed: a fault between the two leaves a RUNNING trial with its re-queue,
        which the next reap finishes (the re-queue is idempotent on retry_of), never a lost re-queue.
        """
        attempt, most = attempt_of(frozen), self.spec.run.max_attempts
        why = f"its worker stopped heart-beating or it ran past its deadline ({self.spec.run.deadline_s:g} s)"
        if attempt >= most:
            result = J.Result(status=J.GIVEN_UP, message=f"{why}, in {attempt} of {most} runs; failed, not re-queued")
            log.warning("trial %d: its route was lost in %d runs (run.max_attempts); failed", frozen.number, attempt)
        else:
            requeue(self.study, frozen, attempt + 1)
            what = "re-queued" if route_of(frozen) else "it had sampled no route yet: nothing to re-queue"
            result = J.Result(status=J.LOST, message=f"{why}; {what}")
            log.warning("trial %d lost its worker; %s", frozen.number, what)
        attrs = outcome.user_attrs(result, self.spec.accuracy.metric, self.spec.accuracy.tolerance, {})
        outcome.record(
            self.study, frozen, result, self.spec.accuracy.tolerance, self.spec.objective.statistic, attrs, fence=fence
        )


@contextlib.contextmanager
def reaping(reap: Callable[[], object], every_s: float) -> Iterator[None]:
    """Run `reap()` every `every_s` seconds in a thread while the block runs; the thread is joined before the block's
    caller goes on. For a block that uses neither the study nor the database (waiting for a child)."""
    done = threading.Event()

    def run() -> None:
        while not done.wait(every_s):
            try:
                reap()
            except Exception as exc:  # the next round tries again; the worker's own work goes on meanwhile
                if not is_db_fault(exc):
                    log.warning("reaping while a child runs failed: %s", type(exc).__name__)

    thread = threading.Thread(target=run, daemon=True, name="reaping")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
