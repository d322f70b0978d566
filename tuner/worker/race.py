"""Racing during the study: re-measure close leaders (paired, exclusive) before the worker asks for more.

After each trial a worker looks at the feasible paired trials (`tuner.study.racing.to_race`): a leader
never re-measured, and leaders whose intervals overlap, are timed again on their stored artifacts in a
fresh child (`tuner.study.reuse`), paired with the baseline engine like a trial. Each re-measurement is
kept (`tuner_measurements`, kind `race`), every paired cycle of the trial is pooled into one refined
interval (with `[[objective.shapes]]` each shape's cycles too, shape by shape), and the study's `racing`
document is updated under the study lock. A trial is claimed there while it is re-measured, so two
workers never race the same trial at once; a claim older than the trial timeout (by the database clock,
one for every host) belongs to a dead worker and is taken over. Each claim carries the id of its
re-measurement: its measurement row is stored once under that id, and its racing change is applied only
while the claim is still its own, so a retried record (the connection broke after a commit) or a claim
taken over changes nothing twice.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from tuner import job as J
from tuner.store.cache import ResultStore, measurement_row, new_run_id
from tuner.store.db import db_now, db_retry, study_lock
from tuner.study import attrs as A
from tuner.study import racing
from tuner.study.reuse import WRAPPER, reuse_env
from tuner.study.setup import Context
from tuner.worker.isolate import ChildHandle, run_isolated
from tuner.worker.jobs import make_job, measurement_stats

log = logging.getLogger("tuner.worker")
KIND = "race"


def stored_engine(
    results: ResultStore, trial: FrozenTrial, known: dict[str, str] | None = None
) -> dict[str, Any] | None:
    """`trial`'s stored artifact as a job's `baseline` (what a child pairs with), if it is on this host.

    `known`: artifact paths by content hash read before (a kept artifact's record never changes), kept up to date.
    """
    sha = trial.user_attrs.get(A.ARTIFACT_SHA256)
    path = (known or {}).get(sha) if sha else None
    if path is None and sha:
        record = results.artifact(sha)
        path = record.path if record is not None else None
    if path is None or not Path(path).is_file():
        return None
    if known is not None:
        known[sha] = path
    return {"trial": trial.number, "path": path, "sha256": sha, "route": dict(trial.params)}


class Racer:
    """One worker's racing of close leaders."""

    def __init__(self, ctx: Context, study: optuna.Study, results: ResultStore, name: str, handle: ChildHandle) -> None:
        self.ctx, self.study, self.results, self.name, self.handle = ctx, study, results, name, handle
        self.artifact_paths: dict[str, str] = {}  # kept artifacts' paths by content hash, as read

    def baseline_engine(self, base: FrozenTrial) -> dict[str, Any] | None:
        """The baseline trial's stored artifact as a job's `baseline`, if it is on this host (its record read once)."""
        return stored_engine(self.results, base, self.artifact_paths)

    def race(self) -> list[int]:
        """Re-measure what `racing.to_race` picks now; the trial numbers re-measured."""
        for attempt in db_retry():
            with attempt:
                trials = self.study.get_trials(deepcopy=False)
                picked = racing.to_race(racing.standings(trials, racing.races(self.study)))
        base = racing.baseline_trial(trials)
        engine = self.baseline_engine(base) if base is not None else None
        if engine is None or base is None:
            return []
        by_number = {t.number: t for t in trials}
        done = []
        for number in picked:
            run_id = new_run_id()
            if not self._claim(number, run_id):
                continue
            result: J.Result | None = None
            try:
                result = self._remeasure(by_number[number], engine)
            finally:
                if self._record(number, run_id, result, base.value):
                    done.append(number)
        return done

    def _update(self, number: int, change: dict[str, Any] | None) -> dict[str, Any]:
        """Read-modify-write trial `number`'s entry of the racing document (caller holds the study lock)."""
        doc = racing.races(self.study)
        entry = dict(doc.get(str(number)) or {})
        if change is not None:
            entry.update(change)
            doc[str(number)] = entry
            self.study.set_user_attr(A.RACING, doc)
        return entry

    def _claim(self, number: int, run_id: str) -> bool:
        """Claim trial `number` for re-measurement unless a live worker has, or it is done racing."""
        for attempt in db_retry():
            with attempt, study_lock(self.ctx.url, self.ctx.spec.study):
                entry = self._update(number, None)
                claim = entry.get("claim") or {}
                now = db_now(self.ctx.url)  # the database clock: claims are compared across hosts
                if claim and now - float(claim.get("since", 0)) < self.ctx.spec.run.trial_timeout_s:
                    return False
                if int(entry.get("remeasured", 0)) + int(entry.get("contended", 0)) >= racing.REMEASURE_MAX:
                    return False
                self._update(number, {"claim": {"worker": self.name, "since": now, "run": run_id}})
        return True

    def _remeasure(self, trial: FrozenTrial, engine: dict[str, Any]) -> J.Result:
        """Time the trial's stored artifact again, paired with the baseline engine, in a fresh child."""
        sha = trial.user_attrs.get(A.ARTIFACT_SHA256)
        record = self.results.artifact(sha) if sha else None
        run_dir = self.ctx.work_dir / "race" / f"{trial.number:05d}-{time.time_ns()}"
        job = make_job(self.ctx, dict(trial.params), run_dir / "out", baseline=engine)
        job.backend = WRAPPER
        try:
            return run_isolated(
                job,
                run_dir,
                self.handle,
                reuse_env(self.ctx.spec.backend.name, Path(record.path) if record else None, sha),
            )
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)

    def _record(self, number: int, run_id: str, result: J.Result | None, baseline_value: float | None) -> bool:
        """Keep the re-measurement, pool every paired cycle of the trial, update its racing entry, release the claim."""
        timed = result is not None and result.status == J.OK and bool(result.paired.get("paired"))
        contended = timed and bool(result.paired.get("contended"))  # other work kept the cores: it decides nothing
        ok = timed and not contended
        for attempt in db_retry():
            with attempt:
                if ok and result is not None:
                    self.results.add_measurement(
                        measurement_row(
                            run_id,
                            self.ctx.spec.study,
                            number,
                            f"race-{self.name}",
                            KIND,
                            {**(result.latency or {}), **measurement_stats(result)},
                            result.samples_ms,
                            result.timing_info,
                        )
                    )
                kept = [
                    p
                    for m in self.results.measurements(self.ctx.spec.study)
                    if m.trial_number == number
                    and m.kind in ("trial", KIND)
                    and not (p := m.stats.get("paired") or {}).get("contended")
                ]
                cycles = [list(p.get("log_ratios", [])) for p in kept]
                with study_lock(self.ctx.url, self.ctx.spec.study):
                    entry = self._update(number, None)
                    if (entry.get("claim") or {}).get("run") != run_id:
                        log.info(
                            "trial %d: this re-measurement's claim is no longer its own; not applied again", number
                        )
                        return ok
                    failure = None if timed else f"{result.status}: {result.message}" if result else "not run"
                    change = racing.after_remeasure(
                        entry, cycles, failure, baseline_value, contended, racing.shape_pools(kept)
                    )
                    self._update(number, change)
        if ok:
            log.info("trial %d re-measured: %s", number, change)
        return ok
