"""Confirm the winner: re-measure the top candidates against the default route before declaring one.

A study's best trial is the minimum of many noisy measurements, so it is biased towards luck. Here
the default route and the top-k feasible non-default routes are timed again over several rounds;
every round runs every route once, each in a fresh child process (`run_isolated` on the trial's
stored artifact, see `tuner.study.reuse`), in an order rotated from round to round. Each
candidate's speedup gets a Hodges-Lehmann estimate and an exact Wilcoxon signed-rank interval over
the rounds (`tuner.measure.speedup`), at a Bonferroni-corrected level so that the family of k
intervals holds at the requested confidence. A candidate is a win only if its interval lies above
1.0; the result is stored as the study user attribute "confirmation" and the raw samples as
measurements of kind "confirm".
"""

from __future__ import annotations

import shutil
import statistics
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from tuner.errors import TunerError
from tuner.space import canonical_route
from tuner.store.cache import ResultStore
from tuner.store.db import confirmation_lock, db_now
from tuner.study.outcome import is_feasible
from tuner.study.reuse import WRAPPER, reuse_env
from tuner.study.setup import Context
from tuner.measure.speedup import Speedup, min_rounds, speedup_interval
from tuner.study.summary import summarize_study
from tuner.study.verdict import DEFAULT_IS_FASTEST, NO_SIGNIFICANT, SPEEDUP
from tuner import job as J
from tuner.worker.isolate import ChildHandle, run_isolated
from tuner.worker.jobs import make_job

ATTR = "confirmation"
METHOD = ("Hodges-Lehmann speedup with an exact Wilcoxon signed-rank interval over per-round log ratios of "
          "the default's and the candidate's {statistic} latency (fresh process per run, rotated order, "
          "Bonferroni over {k} candidate(s))")
NOTHING_TO_CONFIRM = "nothing-to-confirm"  # a confirmation outcome; the other verdicts are `tuner.study.verdict`'s


@dataclass
class Entry:
    """One route in the confirmation: the default or a candidate, with its per-round statistic."""

    trial: FrozenTrial
    label: str
    medians: list[float] = field(default_factory=list)
    failure: str = ""


def rounds_needed(confidence: float, candidates: int) -> int:
    """The fewest rounds for `candidates` intervals that hold jointly at `confidence`."""
    return min_rounds(1.0 - (1.0 - confidence) / max(candidates, 1))


def pick_candidates(trials: list[FrozenTrial], baseline: FrozenTrial, top_k: int) -> list[FrozenTrial]:
    """The `top_k` fastest feasible trials with distinct routes other than the default's."""
    seen = {canonical_route(baseline.params)}
    out: list[FrozenTrial] = []
    for t in sorted((t for t in trials if is_feasible(t)), key=lambda t: (t.value, t.number)):
        key = canonical_route(t.params)
        if key not in seen:
            seen.add(key)
            out.append(t)
        if len(out) == top_k:
            break
    return out


def confirm(ctx: Context, study: optuna.Study, rounds: int | None = None, top_k: int = 3, confidence: float = 0.95,
            log: Callable[[str], None] = print) -> dict[str, Any]:
    """Re-measure, judge, store the "confirmation" document on the study and return it.

    `rounds` defaults to max(8, the fewest rounds that can reach `confidence`); fewer is an error.
    Each run is a fresh child on the trial's stored artifact; its samples are kept as "confirm".
    One confirmation of a study runs at a time, on every host (`confirmation_lock`): a second one
    waits, and if the first confirmed the same state of the study with the same settings meanwhile,
    its document is the answer (the study keeps one confirmation, not the last of two).
    """
    seen = (study.user_attrs.get(ATTR) or {}).get("id")
    with confirmation_lock(ctx.url, ctx.spec.study):
        basis = {"finished": sum(1 for t in study.get_trials(deepcopy=False) if t.state.is_finished()),
                 "rounds": rounds, "top_k": top_k, "confidence": confidence}
        current = study.user_attrs.get(ATTR) or {}
        if current.get("id") not in (None, seen) and current.get("basis") == basis:
            log("another run confirmed this study while this one waited for it; that confirmation stands")
            return current
        return _confirm(ctx, study, rounds, top_k, confidence, log, basis)


def _confirm(ctx: Context, study: optuna.Study, rounds: int | None, top_k: int, confidence: float,
             log: Callable[[str], None], basis: dict[str, Any]) -> dict[str, Any]:
    """Measure in fresh children, judge and store (under the confirmation lock); stamped by the database clock."""
    store = ResultStore(ctx.url)
    run_id = uuid.uuid4().hex[:12]
    run_dir = ctx.work_dir / "confirm" / run_id
    handle = ChildHandle()

    def run(trial: FrozenTrial, r: int) -> J.Result:
        res = _run_once(ctx, store, trial, run_dir / f"r{r:02d}-{trial.number:05d}", handle)
        if res.status == J.OK and res.latency:
            store.add_measurement(ctx.spec.study, trial.number, f"confirm-{run_id}", "confirm",
                                  {**res.latency, "round": r}, res.samples_ms, res.timing_info)
        return res

    try:
        doc = judge_study(study, ctx.spec.objective.statistic, run, rounds, top_k, confidence, log)
    except KeyboardInterrupt:
        handle.kill()
        raise
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    created = datetime.fromtimestamp(db_now(ctx.url), UTC).isoformat(timespec="seconds")  # one clock for every host
    return _store(study, {**doc, "id": run_id, "basis": basis, "created_at": created})


def judge_study(study: optuna.Study, statistic: str, run: Callable[[FrozenTrial, int], J.Result], rounds: int | None = None,
                top_k: int = 3, confidence: float = 0.95, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The confirmation document of `study`: its candidates, each route measured once per round by
    `run(trial, round)`, and the verdict (`confirm` with the child runs; the search benchmark replays them)."""
    summary = summarize_study(study)
    baseline = summary.baseline
    doc: dict[str, Any] = {
        "confidence": confidence, "statistic": statistic, "study_best_trial": summary.best.number if summary.best else None,
        "baseline_trial": baseline.number if baseline else None, "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    candidates = pick_candidates(study.get_trials(deepcopy=False), baseline, top_k) if baseline and is_feasible(baseline) else []
    if not candidates:
        why = "the default route has no feasible measurement" if not baseline or not is_feasible(baseline) else "no feasible route other than the default was found"
        doc.update(verdict=NOTHING_TO_CONFIRM, rounds=0, candidates=[], message=f"nothing to confirm: {why}")
        return doc
    need = rounds_needed(confidence, len(candidates))
    if rounds is None:
        rounds = max(need, 8)
    elif rounds < need:
        raise TunerError(f"--confirm-rounds {rounds} is too few for {confidence:.0%} confidence over {len(candidates)} candidate(s); use at least {need}")
    assert baseline is not None
    entries = [Entry(baseline, "default")] + [Entry(t, f"trial {t.number}") for t in candidates]
    _measure(entries, rounds, statistic, run, log)
    doc.update(_judge(entries, rounds, confidence, statistic))
    return doc


def _measure(entries: list[Entry], rounds: int, statistic: str, run: Callable[[FrozenTrial, int], J.Result],
             log: Callable[[str], None]) -> None:
    """Run every entry once per round, rotating the order; the default's failure ends the measuring."""
    for r in range(rounds):
        shift = r % len(entries)
        for entry in entries[shift:] + entries[:shift]:
            if entry.failure:
                continue
            res = run(entry.trial, r)
            if res.status != J.OK or not res.latency:
                entry.failure = f"{res.status}: {res.message}"[:300]
                log(f"confirm round {r + 1}/{rounds}: {entry.label} failed ({entry.failure})")
                if entry is entries[0]:
                    return  # without the default there is nothing to compare with
                continue
            entry.medians.append(float(res.latency[statistic]))
        log(f"confirm round {r + 1}/{rounds}: " + ", ".join(f"{e.label} {e.medians[-1]:.4g} ms" for e in entries if not e.failure))


def _run_once(ctx: Context, store: ResultStore, trial: FrozenTrial, trial_dir: Path, handle: ChildHandle) -> J.Result:
    """Measure the route of `trial` once, on its stored artifact where that is still here."""
    sha = trial.user_attrs.get("artifact_sha256")
    record = store.artifact(sha) if sha else None
    job = make_job(ctx, dict(trial.params), trial_dir / "out")
    job.backend = WRAPPER
    env = reuse_env(ctx.spec.backend.name, Path(record.path) if record else None, sha)
    return run_isolated(job, trial_dir, handle, env)


def _judge(entries: list[Entry], rounds: int, confidence: float, statistic: str) -> dict[str, Any]:
    """The verdict and the per-candidate intervals (Bonferroni over the candidates)."""
    default, candidates = entries[0], entries[1:]
    per_candidate = 1.0 - (1.0 - confidence) / len(candidates)
    rows: list[dict[str, Any]] = []
    judged: list[tuple[Entry, Speedup]] = []
    for c in candidates:
        row: dict[str, Any] = {"trial": c.trial.number, "route": dict(c.trial.params), "study_value": c.trial.value}
        if c.failure or default.failure:
            row["failure"] = c.failure or f"default route failed: {default.failure}"
        else:
            s = speedup_interval(default.medians, c.medians, per_candidate)
            row.update(s.to_dict(), median_ms=statistics.median(c.medians))
            judged.append((c, s))
        rows.append(row)
    base = {"rounds": rounds, "candidates": rows, "method": METHOD.format(statistic=statistic, k=len(candidates)),
            "default_median_ms": statistics.median(default.medians) if default.medians else None}
    if not judged:
        why = f"the default route failed: {default.failure}" if default.failure else "every candidate failed"
        return {**base, "verdict": NOTHING_TO_CONFIRM, "message": f"nothing to confirm: on re-measurement {why}"}
    wins = [(c, s) for c, s in judged if s.significant]
    entry, s = max(wins or judged, key=lambda cs: cs[1].estimate)
    interval = f"{confidence:.0%} CI {s.low:.3f}x-{s.high:.3f}x over {rounds} interleaved rounds"
    if wins:
        verdict, message = SPEEDUP, f"trial {entry.trial.number} is {s.estimate:.3f}x faster than the default route ({interval})"
    elif all(s.slower for _, s in judged):
        verdict, message = DEFAULT_IS_FASTEST, f"the default route is already the fastest: best candidate trial {entry.trial.number} at {s.estimate:.3f}x ({interval})"
    else:
        verdict, message = NO_SIGNIFICANT, f"no significant speedup over the default route: best candidate trial {entry.trial.number} at {s.estimate:.3f}x ({interval} includes 1.0)"
    return {**base, "verdict": verdict, "message": message, "trial": entry.trial.number, "winner_trial": entry.trial.number if wins else None,
            "speedup": s.estimate, "ci": [s.low, s.high], "interval_confidence": s.confidence}


def _store(study: optuna.Study, doc: dict[str, Any]) -> dict[str, Any]:
    study.set_user_attr(ATTR, doc)
    return doc
