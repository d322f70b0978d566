"""Evaluate a trial's route: known-invalid, a known failure, from the cache, or built and measured in a child.

Cheapest first:

1. a route the search space rules out (`SearchSpace.check`) is an `invalid-route`;
2. a route that needs a product that already failed (a precision variant that did not build) is a
   `known-failure` (`Backend.learned_failure`): no child, no budget;
3. a result cached under the route's content key (model, data, backend and its version, environment,
   route, options, measurement settings) is reused, unless it is a gate failure this tolerance passes;
4. otherwise a fresh child builds, checks and times it (`tuner.worker.isolate`), paired with the
   baseline (`tuner.worker.pairing`; handed over while the child runs where the baseline trial is
   still running), the worker reaping meanwhile (`tuner.worker.reap.reaping`). An
   environment error runs the child again (`ENV_ATTEMPTS` runs in all, backing off); the artifact it
   built is kept (`tuner.worker.artifacts`) and its log goes to Optuna's artifact store. What the child
   found about the route itself (a deterministic status) is stored, the cache row and the measurement
   row, only while the trial's lease holds.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import threading
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna

from tuner import job as J
from tuner.store.cache import ResultStore, cache_key, measurement_row, new_run_id
from tuner.store.db import is_db_fault
from tuner.store.leases import Fence
from tuner.store.models import CachedResult
from tuner.study import attrs as A
from tuner.study import optuna_adapter as oa
from tuner.study import outcome
from tuner.study.setup import Context
from tuner.worker.artifacts import Artifacts, Outside
from tuner.worker.environment import ENV_ATTEMPTS, ENV_BACKOFF_S, environment_fault
from tuner.worker.heartbeat import Heartbeat
from tuner.worker.isolate import ChildHandle, result_file, run_isolated
from tuner.worker.jobs import make_job, measure_settings, measurement_stats
from tuner.worker.pairing import Pairing
from tuner.worker.reap import reaping

log = logging.getLogger("tuner.worker")
NO_ARTIFACT: dict[str, Any] = {"artifact_path": None, "artifact_sha256": None, "artifact_bytes": None}  # not kept


class Evaluator:
    """One worker's evaluation of routes."""

    def __init__(
        self,
        ctx: Context,
        study: optuna.Study,
        results: ResultStore,
        pairing: Pairing,
        stop: threading.Event,
        child: ChildHandle,
        child_env: dict[str, str],
        db: Callable[[Callable[[], Any]], Any],
        reap: Callable[[], object],
    ) -> None:
        self.ctx, self.spec, self.study, self.results, self.pairing = ctx, ctx.spec, study, results, pairing
        self.stop, self.child, self.child_env, self.db, self.reap = stop, child, child_env, db, reap
        backend = ctx.backend
        # recorded with each trial: where it was measured (an export's README says)
        self.environment = {"backend": backend.name, "version": backend.version(), "device": backend.device()}
        self.env_id = results.record_environment(self.environment)
        self.artifacts = Artifacts(ctx.work_dir / "artifacts", results, backend.name, db)

    def evaluate(self, number: int, route: dict[str, Any], lease: Heartbeat) -> tuple[J.Result, dict[str, Any]]:
        """The result for trial `number`'s `route`, and the attributes recorded beside it (cache key, hit, ...).

        A child starts only while the trial's `lease` holds, and what it found is stored (cache and measurement rows)
        only under its fence.
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
        extra: dict[str, Any] = {A.CACHE_KEY: key[:16], A.CACHE_HIT: False, A.ENVIRONMENT: self.environment}
        reason = self.ctx.space.check(route)
        if reason:
            return J.Result(status=J.INVALID_ROUTE, message=reason), extra
        learned = self._learned_failure(route)
        if learned:  # a product this route needs already failed: no child, no budget
            extra[A.FAILURE_KEY] = learned[0]
            return J.Result(status=J.KNOWN_FAILURE, message=f"needs {learned[1]}"), extra
        cached = self.results.lookup(key)
        if cached is not None and self._reusable(cached):
            extra.update({A.CACHE_HIT: True, A.CACHED_FROM: f"{cached.study}#{cached.trial_number}"})
            result = J.Result.from_json(json.dumps(cached.result))
        else:
            result = self._run_child(number, route, lease)
            if result.status in J.DETERMINISTIC and not self.stop.is_set():
                self._store(key, number, route, result, lease.fence)
        if result.status in outcome.FAILURES:  # what failed: a product the child just learned, else this route
            extra[A.FAILURE_KEY] = (self._learned_failure(route) or (key[:16],))[0]
        return result, extra

    def _learned_failure(self, route: dict[str, Any]) -> tuple[str, str] | None:
        return self.ctx.backend.learned_failure(
            route, self.ctx.model_info, self.ctx.work_dir, self.ctx.model_sha, self.ctx.data_sha
        )

    def _reusable(self, cached: CachedResult) -> bool:
        # A gate failure stopped before timing: reuse it only if it still fails this tolerance.
        return cached.status != J.GATE_FAILED or (
            cached.accuracy is not None and cached.accuracy > self.spec.accuracy.tolerance
        )

    def _run_child(self, number: int, route: dict[str, Any], lease: Heartbeat) -> J.Result:
        """Build and measure in a fresh child; an environment error is retried (ENV_ATTEMPTS runs in all)."""
        trial_dir = self.ctx.trials_dir / f"{number:05d}"
        for attempt in range(ENV_ATTEMPTS):
            pairing = self.pairing.settled(number)  # None: the baseline trial runs; it is handed over to the child
            handover = trial_dir / "pairing.json"
            late = {"pairing_path": str(handover), "pairing_wait_s": self.pairing.wait_s}
            job = make_job(self.ctx, route, trial_dir / "out", **(late if pairing is None else pairing))
            with (
                reaping(self.reap, self.spec.run.grace_s),  # a live worker, though its child may wait long
                self.pairing.handed_over(number, handover, result_file(trial_dir), self.child)
                if pairing is None
                else nullcontext() as given,
            ):
                result = run_isolated(job, trial_dir, self.child, self.child_env, lease)
            if result.status != J.ENVIRONMENT_ERROR:
                result = self._with_artifact(result, trial_dir / "out")
            if given is not None and given.timed_out:
                break  # waited as long as a trial may for the baseline: re-queued, not run again here
            if result.status != J.ENVIRONMENT_ERROR or self.stop.is_set() or attempt == ENV_ATTEMPTS - 1:
                break
            log.warning("trial %d: %s; running it again (%d/%d)", number, result.message, attempt + 2, ENV_ATTEMPTS)
            shutil.rmtree(trial_dir / "out", ignore_errors=True)
            self.stop.wait(ENV_BACKOFF_S * 2**attempt)
        self.db(lambda: self._upload_log(number, trial_dir))
        shutil.rmtree(trial_dir / "out", ignore_errors=True)
        return result

    def _with_artifact(self, result: J.Result, out_dir: Path) -> J.Result:
        """`result` with its artifact kept (where, its hash and size), or what keeping it met.

        A path outside the out dir is the build's fault (`build-error`); a disk that fails now is an
        environment error. An artifact not kept is not recorded.
        """
        if not result.artifact_path:
            return result
        try:
            kept = self.artifacts.keep(Path(result.artifact_path), out_dir)
        except Outside as exc:
            return replace(result, status=J.BUILD_ERROR, message=str(exc), **NO_ARTIFACT)
        except OSError as exc:
            fault = environment_fault(exc)
            if fault is None:
                raise
            return replace(
                result, status=J.ENVIRONMENT_ERROR, message=f"could not keep the artifact: {fault}", **NO_ARTIFACT
            )
        if kept is None:
            return replace(result, **NO_ARTIFACT)
        return replace(result, artifact_path=str(kept.path), artifact_sha256=kept.sha256, artifact_bytes=kept.size)

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
        """Keep what the child found, in one transaction while `fence` holds: the cache row under `key` and the
        measurement row of its timing."""
        value = result.latency.get(self.spec.objective.statistic) if result.latency else None
        measurement = None
        if result.samples_ms:
            measurement = measurement_row(
                new_run_id(),
                self.spec.study,
                number,
                key,
                "trial",
                {**(result.latency or {}), **measurement_stats(result)},
                result.samples_ms,
                result.timing_info,
            )
        self.results.save(
            key,
            fence,
            measurement,
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


def _finite_or_none(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _json_safe(result: J.Result) -> dict[str, Any]:
    """The result as JSON-column-safe data (no raw samples or logs; non-finite floats as strings)."""
    light = replace(result, log="", samples_ms=[], baseline_samples_ms=[])  # raw samples live in tuner_measurements
    return _sanitize(json.loads(light.to_json()))


def _sanitize(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _sanitize(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_sanitize(v) for v in obj]
    return obj
