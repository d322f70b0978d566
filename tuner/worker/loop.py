"""One worker: reap lost trials, reserve a budget slot and ask, evaluate in a child, tell; repeat.

The worker survives database faults (retried with backoff), child crashes (recorded with a failure
class) and stops cleanly on SIGTERM/SIGINT: the trial in flight is marked FAIL/interrupted and its
route re-queued, so nothing is left RUNNING and nothing half-done is trusted.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.store.cache import ResultStore, cache_key
from tuner.store.db import db_retry, study_lock
from tuner.store.leases import Leases, Owner
from tuner.study import optuna_adapter as oa
from tuner.study import outcome, racing
from tuner.study.budget import count_trials
from tuner.study.note import update_note
from tuner.study.sampler import make_sampler
from tuner.study.setup import Context
from tuner import job as J
from tuner.worker.isolate import ChildHandle, run_isolated
from tuner.worker.race import Racer
from tuner.worker.timing import BaselineGate

log = logging.getLogger("tuner.worker")


@dataclass
class Stop:
    """Set by a signal handler: finish up and exit."""

    event: threading.Event = field(default_factory=threading.Event)
    child: ChildHandle = field(default_factory=ChildHandle)

    def install(self) -> None:
        """Convert SIGTERM and SIGINT into a clean stop that kills the running child."""
        def handler(signum: int, frame: Any) -> None:
            self.event.set()
            self.child.kill()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


class Worker:
    """The ask/evaluate/tell loop of one worker process."""

    def __init__(self, ctx: Context, budget: int, index: int = 0, stop: Stop | None = None, child_env: dict[str, str] | None = None) -> None:
        self.ctx = ctx
        self.spec = ctx.spec
        self.budget = budget
        self.index = index
        self.stop = stop or Stop()
        self.child_env = child_env or {}
        self.name = f"w{index}-{os.getpid()}"
        self.owner = Owner(self.name)
        self.study = ctx.load(make_sampler(self.spec.run, index))
        self.study_id = oa.study_id(self.study)
        self.leases = Leases(ctx.url, self.spec.study)
        self.results = ResultStore(ctx.url)
        self.env_id = self.results.record_environment(self._environment())
        self.gate = BaselineGate(ctx.work_dir)
        self.holding_gate = ExitStack()  # the baseline gate, while this worker evaluates the baseline trial
        self.racer = Racer(ctx, self.study, self.results, self.name, self.stop.child)

    def _environment(self) -> dict[str, Any]:
        b = self.ctx.backend
        return {"backend": b.name, "version": b.version(), "device": b.device()}

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> int:
        """Work until the budget is used up (and no other worker's trial may still be re-queued)."""
        done = 0
        while not self.stop.event.is_set():
            started = time.perf_counter()
            for attempt in db_retry():
                with attempt:
                    self.reap()
                    trial, others_running = self.reserve()
            if trial is None:
                if others_running == 0:
                    break
                self.stop.event.wait(self.spec.run.heartbeat_s)  # others' trials may still be lost and re-queued
                continue
            self.evaluate_and_tell(trial, started)
            done += 1
            if self.spec.run.racing and not self.stop.event.is_set():
                self.racer.race()  # re-measure close leaders before spending more budget
        return done

    def reserve(self) -> tuple[optuna.Trial | None, int]:
        """Under the study lock: count, and ask only if budget remains. Returns (trial, running)."""
        with study_lock(self.ctx.url, self.spec.study):
            counts = count_trials(self.ctx.url, self.study_id)
            if counts.exhausted(self.budget):
                return None, counts.running
            trial = self.study.ask()
            self.leases.take(oa.trial_id(trial), self.owner)
            if trial.user_attrs.get("source") == racing.BASELINE_SOURCE:
                self.holding_gate.enter_context(self.gate.close_for_baseline())  # before any later trial exists
            return trial, counts.running

    def reap(self) -> list[int]:
        """Fail and re-queue RUNNING trials whose owner is gone. Returns the reaped trial numbers."""
        storage = oa.storage_of(self.study)
        running = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
        started = {oa.trial_id(t): t.datetime_start.timestamp() if t.datetime_start else time.time() for t in running}
        lost = self.leases.expired([oa.trial_id(t) for t in running], started, self.spec.run.grace_s)
        reaped = []
        if not lost:
            return reaped
        with study_lock(self.ctx.url, self.spec.study):
            for trial_id in lost:
                frozen = storage.get_trial(trial_id)
                if frozen.state != TrialState.RUNNING or not self.leases.claim_reap(trial_id):
                    continue
                storage.set_trial_user_attr(trial_id, "failure_class", J.LOST)
                storage.set_trial_user_attr(trial_id, "message", "its worker stopped heart-beating; re-queued")
                storage.set_trial_state_values(trial_id, TrialState.FAIL)
                self._requeue(_route_of(frozen), frozen.number, frozen.user_attrs.get("source"))
                reaped.append(frozen.number)
                log.warning("trial %d lost its worker; re-queued", frozen.number)
        return reaped

    def _requeue(self, params: dict[str, Any], number: int, source: str | None) -> None:
        attrs = {"retry_of": number}
        if source:
            attrs["source"] = source
        self.study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=False)

    # -- one trial ----------------------------------------------------------------------------

    def evaluate_and_tell(self, trial: optuna.Trial, started: float) -> None:
        """Suggest the route, evaluate it (cache or child), record the outcome, release the lease.

        `started` is when this worker began reserving the trial; the time not spent inside the
        child's build/check/time phases is recorded as the tuner's own overhead (`overhead_s`).
        """
        for attempt in db_retry():  # sampling reads the study: retried like every database step
            with attempt:
                route = self.ctx.space.suggest(trial)
        beating = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(oa.trial_id(trial), beating), daemon=True)
        beat.start()
        try:
            result, extra = self.evaluate(trial.number, route)
        finally:
            beating.set()
            beat.join()
        if self.stop.event.is_set() and result.status in (J.CRASH_SIGNAL, J.CRASH_EXIT, J.TIMEOUT):
            result = J.Result(status=J.INTERRUPTED, message="stopped by a signal; re-queued")
        wall = time.perf_counter() - started
        extra.update(trial_wall_s=round(wall, 4), overhead_s=round(wall - sum(result.phase_s.values()), 4))
        try:
            for attempt in db_retry():
                with attempt:
                    self._tell(trial, result, extra)
            if result.status == J.OK and result.artifact_path and trial.user_attrs.get("source") == racing.BASELINE_SOURCE:
                self.gate.publish({"trial": trial.number, "path": result.artifact_path, "sha256": result.artifact_sha256, "route": route})
        finally:
            self.holding_gate.close()
        self.leases.release(oa.trial_id(trial))

    def _tell(self, trial: optuna.Trial, result: J.Result, extra: dict[str, Any]) -> None:
        frozen = oa.storage_of(self.study).get_trial(oa.trial_id(trial))
        if frozen.state.is_finished():
            return  # an earlier attempt was committed before the connection dropped
        attrs = outcome.user_attrs(result, self.spec.accuracy.metric, self.spec.accuracy.tolerance, {**extra, "worker": self.name})
        base = racing.baseline_trial(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
        outcome.record(self.study, trial, result, self.spec.accuracy.tolerance, self.spec.objective.statistic, attrs,
                       base.value if base is not None else None)
        update_note(self.study)  # never raises: the dashboard's study note states the best feasible trial
        if result.status == J.INTERRUPTED:
            with study_lock(self.ctx.url, self.spec.study):
                self._requeue(_route_of(frozen), frozen.number, frozen.user_attrs.get("source"))

    def _heartbeat(self, trial_id: int, stop: threading.Event) -> None:
        while not stop.wait(self.spec.run.heartbeat_s):
            try:
                self.leases.beat(trial_id)
            except Exception as exc:  # a missed beat is retried next period; the grace period covers it
                log.warning("heartbeat failed: %s", type(exc).__name__)

    def evaluate(self, number: int, route: dict[str, Any]) -> tuple[J.Result, dict[str, Any]]:
        """The result for `route`: known-invalid, from the cache, or built and measured in a child."""
        spec = self.spec
        key = cache_key(
            model_sha=self.ctx.model_sha, shapes={k: list(v) for k, v in spec.model.inputs.items()}, data_sha=self.ctx.data_sha,
            backend=self.ctx.backend.name, backend_version=self.ctx.backend.version(), environment_id=self.env_id,
            route=route, options=spec.backend.options,
            measure={"metric": spec.accuracy.metric, "atol": spec.accuracy.atol, "rtol": spec.accuracy.rtol,
                     "gate": spec.data.gate_samples, "timing": timing_settings(spec)},
        )
        extra: dict[str, Any] = {"cache_key": key[:16], "cache_hit": False}
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
                self._store(key, number, route, result)
        if result.status in outcome.FAILURES:  # what failed: a product the child just learned, else this route
            extra["failure_key"] = (self._learned_failure(route) or (key[:16],))[0]
        return result, extra

    def _learned_failure(self, route: dict[str, Any]) -> tuple[str, str] | None:
        return self.ctx.backend.learned_failure(route, self.ctx.model_info, self.ctx.work_dir, self.ctx.model_sha, self.ctx.data_sha)

    def _reusable(self, cached: Any) -> bool:
        # A gate failure stopped before timing: reuse it only if it still fails this tolerance.
        return cached.status != J.GATE_FAILED or (cached.accuracy is not None and cached.accuracy > self.spec.accuracy.tolerance)

    def _run_child(self, number: int, route: dict[str, Any]) -> J.Result:
        trial_dir = self.ctx.work_dir / "trials" / f"{number:05d}"
        job = make_job(self.ctx, route, trial_dir / "out", **self._pairing(number))
        result = run_isolated(job, trial_dir, self.stop.child, self.child_env)
        self._keep_artifact(result)
        self._upload_log(number, trial_dir)
        shutil.rmtree(trial_dir / "out", ignore_errors=True)
        return result

    def _pairing(self, number: int) -> dict[str, Any]:
        """What trial `number` is timed against: its role, the baseline engine (or the gate to wait on), the incumbent."""
        for attempt in db_retry():
            with attempt:
                trials = self.study.get_trials(deepcopy=False)
        this = next(t for t in trials if t.number == number)
        if racing.is_baseline(this):
            return {"role": "baseline"}
        base = racing.baseline_trial(trials)
        pairing: dict[str, Any] = {"incumbent": racing.incumbent(trials, racing.races(self.study))}
        if base is not None:
            pairing["baseline"] = self.racer.baseline_engine(base)
        elif racing.baseline_pending(trials):
            pairing["baseline_gate"] = str(self.ctx.work_dir)
        return pairing

    def _keep_artifact(self, result: J.Result) -> None:
        """Move the artifact to the content-addressed store (work_dir/artifacts/<sha256><suffix>)."""
        if not result.artifact_path or not result.artifact_sha256 or not Path(result.artifact_path).exists():
            return
        src = Path(result.artifact_path)
        dest = self.ctx.work_dir / "artifacts" / f"{result.artifact_sha256}{src.suffix}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            shutil.move(str(src), dest)
        result.artifact_path = str(dest)
        self.results.add_artifact(result.artifact_sha256, str(dest), int(result.artifact_bytes or 0), self.ctx.backend.name)

    def _upload_log(self, number: int, trial_dir: Path) -> None:
        """Bulky per-trial logs go to Optuna's artifact store, not into trial attributes."""
        log_path = trial_dir / "child.log"
        if log_path.exists() and log_path.stat().st_size:
            from optuna.artifacts import FileSystemArtifactStore, upload_artifact

            store_dir = self.ctx.work_dir / "optuna-artifacts"
            store_dir.mkdir(parents=True, exist_ok=True)
            storage = oa.storage_of(self.study)
            frozen = oa.trial_by_number(self.study, number)
            try:
                upload_artifact(artifact_store=FileSystemArtifactStore(str(store_dir)), file_path=str(log_path),
                                study_or_trial=frozen, storage=storage)
            except Exception as exc:  # logs are a convenience; never fail a trial over them
                log.warning("could not store the trial log: %s", exc)

    def _store(self, key: str, number: int, route: dict[str, Any], result: J.Result) -> None:
        value = result.latency.get(self.spec.objective.statistic) if result.latency else None
        self.results.save(
            key, backend=self.ctx.backend.name, backend_version=self.ctx.backend.version(), environment_id=self.env_id,
            route=route, status=result.status, value=value, accuracy=_finite_or_none(result.accuracy),
            result=_json_safe(result), artifact_sha256=result.artifact_sha256, study=self.spec.study, trial_number=number,
        )
        if result.samples_ms:
            self.results.add_measurement(self.spec.study, number, key, "trial", {**(result.latency or {}), **measurement_stats(result)},
                                         result.samples_ms, result.timing_info)


def _route_of(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """The route a trial ran (or was enqueued to run, if it died before sampling)."""
    return dict(trial.params) or dict(trial.system_attrs.get("fixed_params", {}))


def timing_settings(spec: Any) -> list[Any]:
    """The [objective] settings a timing depends on (part of every cache key)."""
    o = spec.objective
    return [o.warmup_s, o.min_repeats, o.min_duration_s, o.mode, o.target_halfwidth, o.timing_cap_s, o.block_s]


def measurement_stats(result: J.Result) -> dict[str, Any]:
    """What a kept measurement records of its pairing: the ratio, its interval, the per-cycle log ratios."""
    p = result.paired
    return {"paired": {k: p[k] for k in ("paired", "speedup", "ci", "stop", "cycles", "log_ratios", "baseline_latency") if k in p}} if p else {}


def make_job(ctx: Context, route: dict[str, Any], out_dir: Path, **pairing: Any) -> J.Job:
    """The child's job for building and measuring `route` of the study `ctx`.

    `pairing` sets the job's role, baseline, baseline_gate and incumbent (see `tuner.job.Job`);
    without it the route is timed alone.
    """
    spec = ctx.spec
    o = spec.objective
    return J.Job(
        backend=spec.backend.name, route=route, model_path=str(spec.model.path),
        input_shapes={k: list(v) for k, v in spec.model.inputs.items()}, options=spec.backend.options,
        work_dir=str(ctx.work_dir), out_dir=str(out_dir), feeds_path=str(ctx.feeds_path),
        reference_path=str(ctx.reference_path), metric=spec.accuracy.metric, tolerance=spec.accuracy.tolerance,
        atol=spec.accuracy.atol, rtol=spec.accuracy.rtol, gate_samples=spec.data.gate_samples,
        warmup_s=spec.objective.warmup_s, min_repeats=spec.objective.min_repeats,
        min_duration_s=spec.objective.min_duration_s, timeout_s=spec.run.trial_timeout_s,
        statistic=o.statistic, mode=o.mode, target_halfwidth=o.target_halfwidth, timing_cap_s=o.timing_cap_s, block_s=o.block_s,
        **pairing,
    )


def _finite_or_none(v: float | None) -> float | None:
    import math

    return v if v is not None and math.isfinite(v) else None


def _json_safe(result: J.Result) -> dict[str, Any]:
    """The result as JSON-column-safe data (no raw samples or logs; non-finite floats as strings)."""
    import json

    data = json.loads(result.to_json())
    data["log"] = ""
    data["samples_ms"] = []  # raw samples live in tuner_measurements
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
