"""One worker: reap lost trials, reserve a budget slot and ask, evaluate in a child, tell; repeat.

The worker waits out database outages of any length (one status line, capped backoff; a finished
child's result is kept and recorded when the database returns), survives child crashes (recorded
with a failure class), retries environment errors (disk full, out of memory, device busy) a few
times and pauses on a burst of them instead of spending budget, and stops cleanly on SIGTERM/SIGINT:
the trial in flight is marked FAIL/interrupted and its route re-queued, so nothing is left RUNNING
and nothing half-done is trusted.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import optuna
from optuna.trial import TrialState

from tuner import job as J
from tuner.measure.exclusive import HOST, DeviceLock
from tuner.measure.inputs import file_hash
from tuner.store.cache import ResultStore, cache_key, new_run_id
from tuner.store.db import OUTAGE, STOP, db_retry, is_db_fault, study_lock
from tuner.store.leases import Fence, LeaseLost, Leases, Owner
from tuner.study import optuna_adapter as oa
from tuner.study import outcome, racing
from tuner.study.budget import count_trials
from tuner.study.note import update_note
from tuner.study.sampler import make_sampler
from tuner.study.setup import Context
from tuner.worker.environment import environment_fault
from tuner.worker.heartbeat import Heartbeat
from tuner.worker.isolate import ChildHandle, run_isolated
from tuner.worker.jobs import make_job, measure_settings, measurement_stats
from tuner.worker.pairing import Pairing
from tuner.worker.race import Racer

log = logging.getLogger("tuner.worker")
T = TypeVar("T")

ENV_ATTEMPTS = 3  # runs of one trial's child before an environment error is given up on (and re-queued)
ENV_BACKOFF_S = 2.0  # wait before the second run; doubled for each further one
ENV_REQUEUES = 2  # times a route is re-queued after environment errors before it is given up
PAUSE_CAP_S = 120.0  # the longest pause of a worker that keeps meeting environment errors


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
    """The ask/evaluate/tell loop of one worker process."""

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
        self.index = index
        self.stop = stop or Stop()
        self.child_env = child_env or {}
        self.name = f"w{index}-{os.getpid()}"
        self.owner = Owner(self.name)
        self.study = ctx.load(make_sampler(self.spec.run, index, ctx.space))
        self.study_id = oa.study_id(self.study)
        self.leases = Leases(ctx.url, self.spec.study)
        self.results = ResultStore(ctx.url)
        self.environment = (
            self._environment()
        )  # recorded with each trial: where it was measured (an export's README says)
        self.env_id = self.results.record_environment(self.environment)
        self.racer = Racer(ctx, self.study, self.results, self.name, self.stop.child)
        run = self.spec.run
        self.pairing = Pairing(
            self.study,
            self.racer,
            run.racing,
            self.stop.event,
            min(1.0, run.heartbeat_s),
            run.trial_timeout_s,
            self.reap,
            self._db,
        )
        self.env_streak = 0  # trials in a row that ended in an environment error
        # Held shared while sampling and recording (CPU work): no CPU timing meanwhile; a wait as long as a trial
        # (a stuck holder) goes ahead without it.
        self.cores = DeviceLock(HOST, wait_s=run.trial_timeout_s, go_ahead=True)

    def _db(self, fn: Callable[[], T]) -> T:
        """`fn()` retried until the database answers, however long that takes, or until a stop."""
        for attempt in db_retry():
            with attempt:
                value = fn()
        return value

    def _environment(self) -> dict[str, Any]:
        b = self.ctx.backend
        return {"backend": b.name, "version": b.version(), "device": b.device()}

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
                if self.spec.run.racing and not self.stop.event.is_set():
                    self.racer.race()  # re-measure close leaders before spending more budget
        except Exception as exc:
            if not (self.stop.event.is_set() and is_db_fault(exc)):
                raise
            log.warning("stopped while the database was unreachable; a trial in flight is reaped by the next run")
        return done

    def _reap_and_reserve(self) -> tuple[optuna.Trial | None, Fence | None, int]:
        self.reap()
        return self.reserve()

    def _hand_back(self, trial: optuna.Trial, fence: Fence, why: str = "stopped before it ran") -> None:
        """A reserved trial that will not run: interrupted (not counted), its route re-queued."""
        result = J.Result(status=J.INTERRUPTED, message=f"{why}; re-queued")
        self._settle(trial, lambda: self._db(lambda: self._tell(trial, result, {}, fence)))

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

    def reap(self) -> list[int]:
        """Fail and re-queue RUNNING trials whose owner is gone or whose deadline passed. Returns their numbers.

        A route lost in `run.max_attempts` runs is failed instead (`given-up`, counted), once.
        """
        run = self.spec.run
        storage = oa.storage_of(self.study)
        running = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
        # Right after an outage every heartbeat is stale: trust only dead PIDs until live workers have beaten again.
        trust = not OUTAGE.recent(run.grace_s)
        lost = self.leases.expired([oa.trial_id(t) for t in running], run.grace_s, run.deadline_s, trust)
        reaped = []
        if not lost:
            return reaped
        with study_lock(self.ctx.url, self.spec.study):
            for trial_id in lost:
                frozen = storage.get_trial(trial_id)
                if frozen.state != TrialState.RUNNING:
                    continue
                fence = self.leases.claim_reap(trial_id, run.grace_s, run.deadline_s)  # its owner now writes nothing
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
        attempt, most = _attempt(frozen), self.spec.run.max_attempts
        why = f"its worker stopped heart-beating or it ran past its deadline ({self.spec.run.deadline_s:g} s)"
        if attempt >= most:
            result = J.Result(status=J.GIVEN_UP, message=f"{why}, in {attempt} of {most} runs; failed, not re-queued")
            log.warning("trial %d: its route was lost in %d runs (run.max_attempts); failed", frozen.number, attempt)
        else:
            self._requeue(frozen, attempt + 1)
            result = J.Result(status=J.LOST, message=f"{why}; re-queued")
            log.warning("trial %d lost its worker; re-queued", frozen.number)
        attrs = outcome.user_attrs(result, self.spec.accuracy.metric, self.spec.accuracy.tolerance, {})
        outcome.record(
            self.study, frozen, result, self.spec.accuracy.tolerance, self.spec.objective.statistic, attrs, fence=fence
        )

    def _requeue(self, frozen: optuna.trial.FrozenTrial, attempt: int, env_requeues: int = 0) -> None:
        """Enqueue `frozen`'s route as its run `attempt` unless it already was (idempotent on `retry_of`).

        Call with the study lock held.
        """
        params = _route_of(frozen)
        if not params:
            return  # it never sampled a route: the sampler proposes afresh
        attrs: dict[str, Any] = {"retry_of": frozen.number}
        if attempt > 1:
            attrs["attempt"] = attempt
        if env_requeues:
            attrs["env_requeues"] = env_requeues
        if frozen.user_attrs.get("source"):
            attrs["source"] = frozen.user_attrs["source"]
        oa.enqueue_retry(self.study, params, attrs)  # idempotent: an earlier attempt may have enqueued it

    # -- one trial ----------------------------------------------------------------------------

    def evaluate_and_tell(self, trial: optuna.Trial, fence: Fence, started: float) -> None:
        """Suggest the route, evaluate it (cache or child), record the outcome (which ends the lease).

        `started` is when this worker began reserving the trial; the time not spent inside the
        child's build/check/time phases is recorded as the tuner's own overhead (`overhead_s`).
        """
        self._settle(trial, lambda: self._evaluate_and_tell(trial, fence, started))

    def _evaluate_and_tell(self, trial: optuna.Trial, fence: Fence, started: float) -> None:
        with Heartbeat(self.leases, fence, self.spec.run.heartbeat_s):
            route = self._db(lambda: self._on_cores(lambda: self.ctx.space.suggest(trial)))  # sampling reads the study
            result, extra = self.evaluate(trial.number, route, fence)
        if self.stop.event.is_set() and result.status in (J.CRASH_SIGNAL, J.CRASH_EXIT, J.TIMEOUT, J.ENVIRONMENT_ERROR):
            result = J.Result(status=J.INTERRUPTED, message="stopped by a signal; re-queued")
        wall = time.perf_counter() - started
        extra.update(trial_wall_s=round(wall, 4), overhead_s=round(wall - sum(result.phase_s.values()), 4))
        self._db(lambda: self._on_cores(lambda: self._tell(trial, result, extra, fence)))
        self._pace(result)

    def _settle(self, trial: optuna.Trial, work: Callable[[], None]) -> None:
        """Run `work`, which writes trial `trial`'s result under its lease; a lease reaped meanwhile discards it."""
        try:
            work()
        except LeaseLost:
            log.warning("trial %d was reaped while this worker was stopped; its late result is discarded", trial.number)

    def _on_cores(self, fn: Callable[[], T]) -> T:
        """`fn()` holding the host lock shared (sampling and recording use the cores); retried by `_db` outside."""
        with self.cores.shared():
            return fn()

    def _pace(self, result: J.Result) -> None:
        """After an environment error, pause (doubling, capped) instead of burning budget; say so once."""
        if result.status != J.ENVIRONMENT_ERROR:
            if self.env_streak:
                log.warning("environment errors cleared; worker %s resumes", self.name)
            self.env_streak = 0
            return
        self.env_streak += 1
        pause = min(PAUSE_CAP_S, ENV_BACKOFF_S * 2 ** (ENV_ATTEMPTS + self.env_streak - 2))
        if self.env_streak == 1:
            log.warning(
                "worker %s paused: %s (%d runs in a row); the trial is re-queued, nothing is cached; "
                "retrying every <= %g s until the machine recovers",
                self.name,
                result.message,
                ENV_ATTEMPTS,
                PAUSE_CAP_S,
            )
        self.stop.event.wait(pause)

    def _tell(self, trial: optuna.Trial, result: J.Result, extra: dict[str, Any], fence: Fence) -> None:
        """Record the outcome under the lease `fence`; an uncounted one re-queues the route first (both safe to repeat).

        An attempt committed before the connection dropped is not written again; a lease reaped meanwhile
        raises `LeaseLost` (the reaper re-queued the route).
        """
        frozen = oa.storage_of(self.study).get_trial(oa.trial_id(trial))
        env_requeues = int(frozen.user_attrs.get("env_requeues", 0)) + 1 if result.status == J.ENVIRONMENT_ERROR else 0
        if env_requeues > ENV_REQUEUES:
            log.warning(
                "trial %d: its route met environment errors in %d trials; given up (not re-queued, not counted)",
                frozen.number,
                env_requeues,
            )
        elif result.status in (J.INTERRUPTED, J.ENVIRONMENT_ERROR):
            with study_lock(self.ctx.url, self.spec.study):
                self._requeue(frozen, _attempt(frozen), env_requeues)  # not the route's doing: the same attempt
        attrs = outcome.user_attrs(
            result, self.spec.accuracy.metric, self.spec.accuracy.tolerance, {**extra, "worker": self.name}
        )
        base = racing.baseline_trial(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
        outcome.record(
            self.study,
            trial,
            result,
            self.spec.accuracy.tolerance,
            self.spec.objective.statistic,
            attrs,
            base.value if base is not None else None,
            self.spec.objective.max_memory_mb,
            fence,
        )
        update_note(self.study)  # never raises: the dashboard's study note states the best feasible trial

    def evaluate(self, number: int, route: dict[str, Any], fence: Fence) -> tuple[J.Result, dict[str, Any]]:
        """The result for `route`: known-invalid, from the cache, or built and measured in a child.

        What the child found is stored (cache and measurement rows) only while the lease `fence` holds.
        """
        spec = self.spec
        key = cache_key(
            model_sha=self.ctx.model_sha,
            shapes={k: list(v) for k, v in spec.model.inputs.items()},
            data_sha=self.ctx.data_sha,
            backend=self.ctx.backend.name,
            backend_version=self.ctx.backend.version(),
            environment_id=self.env_id,
            route=route,
            options=spec.backend.options,
            measure=measure_settings(spec),
        )
        extra: dict[str, Any] = {"cache_key": key[:16], "cache_hit": False, "environment": self.environment}
        reason = self.ctx.space.check(route)
        if reason:
            return J.Result(status=J.INVALID_ROUTE, message=reason), extra
        learned = self._learned_failure(route)
        if learned:  # a product this route needs already failed: no child, no budget
            extra["failure_key"] = learned[0]
            return J.Result(status=J.KNOWN_FAILURE, message=f"needs {learned[1]}"), extra
        cached = self.results.lookup(key)
        if cached is not None and self._reusable(cached):
            extra.update(cache_hit=True, cached_from=f"{cached.study}#{cached.trial_number}")
            result = J.Result.from_json(_json(cached.result))
        else:
            result = self._run_child(number, route)
            if result.status in J.DETERMINISTIC and not self.stop.event.is_set():
                self._store(key, number, route, result, fence)
        if result.status in outcome.FAILURES:  # what failed: a product the child just learned, else this route
            extra["failure_key"] = (self._learned_failure(route) or (key[:16],))[0]
        return result, extra

    def _learned_failure(self, route: dict[str, Any]) -> tuple[str, str] | None:
        return self.ctx.backend.learned_failure(
            route, self.ctx.model_info, self.ctx.work_dir, self.ctx.model_sha, self.ctx.data_sha
        )

    def _reusable(self, cached: Any) -> bool:
        # A gate failure stopped before timing: reuse it only if it still fails this tolerance.
        return cached.status != J.GATE_FAILED or (
            cached.accuracy is not None and cached.accuracy > self.spec.accuracy.tolerance
        )

    def _run_child(self, number: int, route: dict[str, Any]) -> J.Result:
        """Build and measure in a fresh child; an environment error is retried (ENV_ATTEMPTS runs in all)."""
        trial_dir = self.ctx.trials_dir / f"{number:05d}"
        try:
            pairing = self.pairing.for_trial(number)
        except TimeoutError as exc:
            return J.Result(status=J.ENVIRONMENT_ERROR, phase="start-up", message=str(exc.strerror or exc))
        job = make_job(self.ctx, route, trial_dir / "out", **pairing)
        for attempt in range(ENV_ATTEMPTS):
            result = run_isolated(job, trial_dir, self.stop.child, self.child_env)
            if result.status != J.ENVIRONMENT_ERROR:
                self._keep_artifact(result, trial_dir / "out")
            if result.status != J.ENVIRONMENT_ERROR or self.stop.event.is_set() or attempt == ENV_ATTEMPTS - 1:
                break
            log.warning("trial %d: %s; running it again (%d/%d)", number, result.message, attempt + 2, ENV_ATTEMPTS)
            shutil.rmtree(trial_dir / "out", ignore_errors=True)
            self.stop.event.wait(ENV_BACKOFF_S * 2**attempt)
        self._db(lambda: self._upload_log(number, trial_dir))
        shutil.rmtree(trial_dir / "out", ignore_errors=True)
        return result

    def _keep_artifact(self, result: J.Result, out_dir: Path) -> None:
        """Check the child's artifact and move it to the content-addressed store (work_dir/artifacts/<sha256><suffix>).

        The child's report is not trusted: the path must lie inside the trial's out dir, and the hash
        and size recorded are the ones computed here. A disk that is full now is an environment error.
        """
        if not result.artifact_path:
            return
        src = Path(result.artifact_path)
        if not src.resolve().is_relative_to(out_dir.resolve()):
            result.status = J.BUILD_ERROR
            result.message = f"the build reported an artifact outside its out dir ({src}); not kept"
            result.artifact_path = result.artifact_sha256 = result.artifact_bytes = None
            return
        if not src.is_file():
            result.artifact_path = result.artifact_sha256 = result.artifact_bytes = None
            return
        try:
            result.artifact_sha256, result.artifact_bytes = file_hash(src), src.stat().st_size
            dest = self.ctx.work_dir / "artifacts" / f"{result.artifact_sha256}{src.suffix}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists():
                shutil.move(str(src), dest)
        except OSError as exc:
            fault = environment_fault(exc)
            if fault is None:
                raise
            result.status, result.message = J.ENVIRONMENT_ERROR, f"could not keep the artifact: {fault}"
            return
        result.artifact_path = str(dest)
        self._db(
            lambda: self.results.add_artifact(
                str(result.artifact_sha256), str(dest), int(result.artifact_bytes or 0), self.ctx.backend.name
            )
        )

    def _upload_log(self, number: int, trial_dir: Path) -> None:
        """Bulky per-trial logs go to Optuna's artifact store, not into trial attributes."""
        log_path = trial_dir / "child.log"
        if log_path.exists() and log_path.stat().st_size:
            from optuna.artifacts import FileSystemArtifactStore, upload_artifact

            storage = oa.storage_of(self.study)
            frozen = oa.trial_by_number(self.study, number)
            try:
                store_dir = self.ctx.work_dir / "optuna-artifacts"
                store_dir.mkdir(parents=True, exist_ok=True)
                upload_artifact(
                    artifact_store=FileSystemArtifactStore(str(store_dir)),
                    file_path=str(log_path),
                    study_or_trial=frozen,
                    storage=storage,
                )
            except Exception as exc:  # logs are a convenience; never fail a trial over them
                if is_db_fault(exc):
                    raise  # retried by the caller once the database is back
                log.warning("could not store the trial log: %s", exc)

    def _store(self, key: str, number: int, route: dict[str, Any], result: J.Result, fence: Fence) -> None:
        value = result.latency.get(self.spec.objective.statistic) if result.latency else None
        self.results.save(
            key,
            fence,
            backend=self.ctx.backend.name,
            backend_version=self.ctx.backend.version(),
            environment_id=self.env_id,
            route=route,
            status=result.status,
            value=value,
            accuracy=_finite_or_none(result.accuracy),
            result=_json_safe(result),
            artifact_sha256=result.artifact_sha256,
            study=self.spec.study,
            trial_number=number,
        )
        if result.samples_ms:
            self.results.add_measurement(
                new_run_id(),
                self.spec.study,
                number,
                key,
                "trial",
                {**(result.latency or {}), **measurement_stats(result)},
                result.samples_ms,
                result.timing_info,
                fence,
            )


def _attempt(trial: optuna.trial.FrozenTrial) -> int:
    """Which run of its route a trial is, counting the runs that ended `lost` (1 for the first)."""
    return int(trial.user_attrs.get("attempt", 1))


def _route_of(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """The route a trial ran (or was enqueued to run, if it died before sampling)."""
    return dict(trial.params) or dict(trial.system_attrs.get("fixed_params", {}))


def _finite_or_none(v: float | None) -> float | None:
    import math

    return v if v is not None and math.isfinite(v) else None


def _json_safe(result: J.Result) -> dict[str, Any]:
    """The result as JSON-column-safe data (no raw samples or logs; non-finite floats as strings)."""
    import json

    data = json.loads(result.to_json())
    data["log"] = ""
    data["samples_ms"] = data["baseline_samples_ms"] = []  # raw samples live in tuner_measurements
    return _sanitize(data)


def _sanitize(obj: Any) -> Any:
    import math

    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _sanitize(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_sanitize(v) for v in obj]
    return obj


def _json(data: dict[str, Any]) -> str:
    import json

    return json.dumps(data)
