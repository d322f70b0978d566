"""Confirm the winner: re-measure the top candidates against the default route until the verdict is decided.

A study's best trial is the minimum of many noisy measurements, so it is biased towards luck. Here
each of the top-k feasible non-default routes is timed again against the default route. A *round*
runs one fresh child process per candidate (`run_isolated` on the trial's stored artifact, see
`tuner.study.reuse`), in an order rotated from round to round, and each child times the candidate
paired with the default's engine in ABBA blocks, as a trial is timed (`tuner.worker.timing`). The
two engines reach a child's timing by different paths, and the path of the route's own engine gave
it about 1 % in an A/A test: every other process of a candidate swaps them (`Job.swapped`: the
default's engine loaded as the route, the candidate's as the baseline; where the candidate's engine
is stored on this host, else it is built in its process as before), so that share cancels in the
pooled estimate and its spread widens the interval. A
process's ratio can sit a few percent off another's for its whole life, so one candidate's processes
are pooled as a random-effects combination (`tuner.measure.speedup.pooled_speedup`, as racing
does, with the Hartung-Knapp interval a few measurements need), whose interval widens when they disagree.

A win is reported only when its interval lies above MIN_SPEEDUP, not merely above 1.0: the processes
of one study are not fully independent draws (their estimates sit together, each study at its own
offset), and an A/A study of one engine against itself showed pooled offsets of up to 1.4 % whose
intervals excluded 1.0 before the processes alternated the engines' paths (docs/measurement.md).

Rounds run one after another and stop as soon as the verdict cannot change (`decided`): the
leader's interval lies above MIN_SPEEDUP and clear of every other candidate's; or it lies above
MIN_SPEEDUP and so does that of every candidate not clear of it, each with an estimate within TIE of
the leader's (a tie: whichever of them is used, its speedup is confirmed and it is at most about TIE
slower; the leader is named, the others beside it); or it lies above MIN_SPEEDUP and the cap cannot
tell the leader from any candidate not clear of it (`unbreakable`: were the estimates to stay where
they are, the intervals the cap's processes would give still overlap, so the rounds left can only
confirm the leader's win, which is confirmed already); or every candidate's lies below
MIN_SPEEDUP (none can become a win); else at the cap (`rounds`, default DEFAULT_ROUNDS), after at
least MIN_ROUNDS. Of the wins that cannot be told apart, the verdict names the one fastest when its
estimate is pooled with the study's own measurements of it (`named`), not merely the one these
processes put first. A candidate that can no longer be the answer (its interval below another's, or
below MIN_SPEEDUP) is not measured again (`settled`). Looking
after every round is paid for in the intervals: each is at the level 1 - (1 - confidence) / (k *
looks), Bonferroni over the k candidates and the looks the cap allows, so the family of intervals
holds jointly at the requested confidence at every look, and a study whose routes are all the same
engine reports a win at most 1 - confidence of the time. A process whose timing stayed contended
by other work on the host (`contended` in its paired summary) is kept but decides nothing; it is
run again, up to CONTENDED_EXTRA extra rounds; when after MIN_ROUNDS rounds more than BUSY_SHARE of
the processes were contended, the host is busy (more rounds would mostly be contended too): the
confirmation stops, judges what was measured uncontended, and says the host was busy.

A near tie with the default route goes on past the cap (`near_tie`): when at the cap no candidate
is a win but one is significantly faster than the default (its interval above 1.0, not yet clear
of MIN_SPEEDUP: a route a few percent faster, which eight processes cannot resolve) and the
processes to come could make it one (at its estimate, the interval EXTEND times the cap's processes
would give lies above MIN_SPEEDUP; a route 0.5 % faster, or two identical engines a process offset
apart, never), those candidates are measured on, up to EXTEND times the cap. The extension pays for its two looks
(halfway and at its end, `look_rounds`) with the share of the look at the round before the cap,
which is skipped: every other look keeps its level, so a study decided before then stops exactly as
before, one that would have been decided at the round before the cap is decided at the cap, and
the family still holds at the requested confidence.

A process's own timing need be no finer than the decision needs (`process_target`): its half-width
may be DISTANCE_SHARE of the distance (in log) between the candidate's estimate and MIN_SPEEDUP (a
route 1.5x faster is shown a win by a process of ±4 %; one 3 % faster needs the study's own
precision), or SPREAD_SHARE of the standard deviation of the candidate's processes so far (the
pooled interval carries that spread anyway), where either is looser than the study's
`target_halfwidth`; never looser than PROCESS_TARGET_MAX. The estimate is the mean of the
candidate's processes so far, before the first one the study's own figure.

With `[[objective.shapes]]` a process's per-shape figures are pooled too, shape by shape, at the same
level: each candidate row gets `shapes` (inputs, weight, `speedup`, `ci`, the median `route_ms` and
`default_ms`), and the message says the per-shape speedups (`tuner.measure.shapes.per_shape`).

The result is stored as the study user attribute "confirmation", with what it confirmed (the
candidates, the default, the settings: `is_current` tells whether it still holds), and the raw
samples as measurements of kind "confirm" (the candidate's and the default's of each process).
Every finished process is reported to `on_round` as a `RoundEvent`, as it happens.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import statistics
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from statistics import NormalDist
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from tuner import job as J
from tuner.errors import TunerError
from tuner.measure.pooling import Pooled, ShapePools, median_finite
from tuner.measure.shapes import per_shape
from tuner.measure.speedup import Speedup, student_t_quantile
from tuner.space import canonical_route
from tuner.store.cache import ResultStore, measurement_row, new_run_id
from tuner.store.db import confirmation_lock, db_now
from tuner.study import attrs as A
from tuner.study.outcome import is_feasible
from tuner.study.racing import CONFIDENCE as RACING_CONFIDENCE
from tuner.study.racing import Races, Standing, races, refined_value, standing
from tuner.study.reuse import WRAPPER, reuse_env
from tuner.study.setup import Context
from tuner.study.summary import summarize_study
from tuner.study.verdict import DEFAULT_IS_FASTEST, NO_SIGNIFICANT, SPEEDUP
from tuner.worker.isolate import ChildHandle, run_isolated
from tuner.worker.jobs import make_job, measure_settings
from tuner.worker.race import stored_engine

DEFAULT_ROUNDS = 8  # the cap on rounds (processes per candidate) unless --confirm-rounds says otherwise
MIN_ROUNDS = 3  # processes per candidate before the verdict may be decided: their spread needs three to be seen
EXTEND = 2  # a near tie with the default route may run to this many times the cap (`near_tie`)
MIN_SPEEDUP = 1.01  # the least speedup reported as a win: its interval must lie above this, not just above 1.0
CONTENDED_EXTRA = 4  # rounds run beyond the cap to replace contended processes
TIE = 0.02  # candidates not told apart from the leader whose estimates lie within this of its own: a tie
DISTANCE_SHARE = 0.1  # a process's half-width may be this share of its candidate's log distance from MIN_SPEEDUP ...
SPREAD_SHARE = 0.5  # ... or this share of the standard deviation of its candidate's processes (`process_target`) ...
PROCESS_TARGET_MAX = 0.05  # ... but never looser than this
BUSY_SHARE = 2 / 3  # after MIN_ROUNDS rounds, more than this share of processes contended: the host is busy, stop
METHOD = (
    "per candidate: fresh processes, each timing it paired with the default route in ABBA blocks of the {statistic} "
    "latency; the processes' Hodges-Lehmann estimates pooled by random effects (DerSimonian-Laird); intervals at "
    "{level:.4%}: Bonferroni over {k} candidate(s) and {looks} look(s), stopping once the verdict is decided; a win "
    "needs its interval above {min_speedup}x"
)
EXTENDED = "; a near tie with the default route measured on to {rounds} rounds, its looks at {level:.4%}"
NOTHING_TO_CONFIRM = "nothing-to-confirm"  # a confirmation outcome; the other verdicts are `tuner.study.verdict`'s


@dataclass
class Candidate(Pooled):
    """One candidate route's measurements against the default, and (`[[objective.shapes]]`) each shape's."""

    trial: FrozenTrial
    contended: int = 0  # processes whose timing stayed contended: kept, not pooled
    loads: list[dict[str, Any]] = field(default_factory=list)  # each timed process's contention summary
    failure: str = ""
    shapes: ShapePools = field(default_factory=ShapePools)  # each shape's figures


@dataclass(frozen=True)
class RoundEvent:
    """One confirmation process finished: what it measured and where every candidate stands now."""

    round: int  # 1-based
    cap: int
    trial: int
    speedup: Speedup | None  # this process's paired speedup (its own interval), None when it failed
    contended: bool
    failure: str
    standings: Mapping[int, Speedup]  # every candidate's pooled speedup so far, by trial number
    decided: str  # why the confirmation stops here ("" while it goes on)

    def text(self) -> str:
        """One progress line."""
        if self.failure:
            what = f"failed ({self.failure})"
        elif self.speedup is None:
            what = "no interval"
        else:
            what = f"{self.speedup.estimate:.3f}x [{self.speedup.low:.3f}-{self.speedup.high:.3f}]" + (
                " contended, not counted" if self.contended else ""
            )
        pooled = ", ".join(f"trial {n} {s.estimate:.3f}x [{s.low:.3f}-{s.high:.3f}]" for n, s in self.standings.items())
        return (
            f"confirm round {self.round}/{self.cap}: trial {self.trial} {what}"
            + (f"; pooled: {pooled}" if pooled else "")
            + (f"; decided: {self.decided}" if self.decided else "")
        )


def looks(cap: int) -> int:
    """How many times the verdict may be looked at with a cap of `cap` rounds (after each round from MIN_ROUNDS on)."""
    return max(1, cap - MIN_ROUNDS + 1)


def interval_level(confidence: float, candidates: int, cap: int) -> float:
    """The level of each interval: Bonferroni over the candidates and the looks, so that all hold jointly at
    `confidence`."""
    return 1.0 - (1.0 - confidence) / (max(candidates, 1) * looks(cap))


def extendable(cap: int) -> bool:
    """Whether a confirmation with this cap may go on past it (`near_tie`): it has a look before the cap to trade."""
    return cap >= MIN_ROUNDS + 2


def look_rounds(cap: int, extend: bool = True, extended: bool = False) -> tuple[int, ...]:
    """The rounds after which the verdict is looked at: each from MIN_ROUNDS to the cap, but the one before the cap
    where the confirmation may go on past it (`extend`, `extendable`); `extended`, then also halfway to EXTEND x the
    cap and there."""
    if not (extend and extendable(cap)):
        return tuple(range(MIN_ROUNDS, cap + 1))
    rounds = (*range(MIN_ROUNDS, cap - 1), cap)
    return (*rounds, (cap + EXTEND * cap + 1) // 2, EXTEND * cap) if extended else rounds


def extension_level(level: float) -> float:
    """The level of the extension's intervals: its two looks share the error of the look before the cap."""
    return 1.0 - (1.0 - level) / 2


def near_tie(standings: Mapping[int, Speedup], processes: Mapping[int, int], cap: int) -> list[int]:
    """The candidates more processes may still make a win of: with no win yet, those significantly faster than the
    default route (their interval above 1.0) but not clear of MIN_SPEEDUP, whose interval at EXTEND x the `cap`
    processes (`halfwidth_at_cap`, at the estimate where it is) would clear MIN_SPEEDUP; empty otherwise."""
    if any(is_win(s) for s in standings.values()):
        return []
    longest = EXTEND * cap
    return [
        n
        for n, s in standings.items()
        if s.low > 1.0 and math.log(s.estimate / MIN_SPEEDUP) > halfwidth_at_cap(s, processes[n], longest)
    ]


def halfwidth_at_cap(s: Speedup, processes: int, cap: int) -> float:
    """The half-width (in log) of the interval `cap` processes would give if they spread as the `processes` so far:
    the standard error shrinks with the square root of their number and the t quantile with their degrees of
    freedom."""
    if processes < 2 or cap <= processes:
        return math.log(s.high / s.low) / 2
    p = 0.5 + s.confidence / 2
    shrink = math.sqrt(processes / cap) * student_t_quantile(p, cap - 1) / student_t_quantile(p, processes - 1)
    return math.log(s.high / s.low) / 2 * shrink


def unbreakable(best: Speedup, best_processes: int, other: Speedup, other_processes: int, cap: int) -> bool:
    """Whether the cap cannot tell `other` from the leader `best` (each pooled over so many processes): with the
    estimates where they are, the intervals of `cap` processes each would still overlap."""
    reach = halfwidth_at_cap(best, best_processes, cap) + halfwidth_at_cap(other, other_processes, cap)
    return math.log(best.estimate / other.estimate) < reach


def decided(standings: Mapping[int, Speedup], processes: Mapping[int, int], cap: int) -> str:
    """Why the verdict can no longer change (one phrase), or "" while it can; `processes` (pooled per candidate) and
    the `cap` tell whether the rounds left could still tell the leader from a close candidate (`unbreakable`)."""
    if not standings:
        return ""
    leader, best = max(standings.items(), key=lambda item: item[1].estimate)
    close = [n for n, s in standings.items() if n != leader and s.high >= best.low]  # not clear of the leader
    if is_win(best) and not close:
        return f"trial {leader} is faster than the default route" + (
            " and than every other candidate" if len(standings) > 1 else ""
        )
    tied = _trials(sorted([leader, *close]))  # the verdict names one, the study's own measurements pooled in (`judge`)
    if is_win(best) and all(is_win(standings[n]) and standings[n].estimate * (1 + TIE) >= best.estimate for n in close):
        return f"{tied} are each faster than the default route and cannot be told apart (within {TIE:.0%})"
    if is_win(best) and all(unbreakable(best, processes[leader], standings[n], processes[n], cap) for n in close):
        if all(is_win(standings[n]) for n in close):
            return f"{tied} are each faster than the default route; {cap} rounds could not tell them apart here"
        rivals = _trials(sorted(close))  # not wins themselves: their intervals reach below MIN_SPEEDUP
        return f"trial {leader} is faster than the default route; {cap} rounds could not tell it from {rivals} here"
    if all(s.slower for s in standings.values()):
        return "every candidate is slower than the default route"
    if all(s.high < MIN_SPEEDUP for s in standings.values()):
        return f"no candidate can be {MIN_SPEEDUP}x faster than the default route"
    return ""


def _trials(numbers: list[int]) -> str:
    """`trials 3, 4 and 17`, or `trial 3`."""
    if len(numbers) == 1:
        return f"trial {numbers[0]}"
    head, last = ", ".join(str(n) for n in numbers[:-1]), numbers[-1]
    return f"trials {head} and {last}"


def settled(number: int, standings: Mapping[int, Speedup]) -> bool:
    """Whether the candidate `number` can no longer be the answer: its interval lies below another candidate's, or
    below MIN_SPEEDUP (it cannot become a win); more processes of it would not change the verdict."""
    s = standings.get(number)
    return s is not None and (s.high < MIN_SPEEDUP or any(s.high < o.low for n, o in standings.items() if n != number))


def is_win(s: Speedup) -> bool:
    """Whether a pooled speedup is reported as a win: its interval lies above MIN_SPEEDUP."""
    return s.low > MIN_SPEEDUP


def process_target(target: float, study_speedup: float | None, log_speedups: list[float]) -> float:
    """The half-width a candidate's next process times to: the study's `target`, or where looser (up to
    PROCESS_TARGET_MAX) DISTANCE_SHARE of the log distance between the candidate's estimate (the mean of its
    processes' log speedups so far, before any the study's `study_speedup`) and MIN_SPEEDUP, or SPREAD_SHARE of the
    standard deviation of its processes (two at least)."""
    estimate = statistics.mean(log_speedups) if log_speedups else math.log(study_speedup or MIN_SPEEDUP)
    loose = DISTANCE_SHARE * abs(estimate - math.log(MIN_SPEEDUP))
    if len(log_speedups) >= 2:
        loose = max(loose, SPREAD_SHARE * statistics.stdev(log_speedups))
    return max(target, min(PROCESS_TARGET_MAX, loose))


def pick_candidates(
    trials: list[FrozenTrial], baseline: FrozenTrial, top_k: int, raced: Races | None = None
) -> list[FrozenTrial]:
    """The `top_k` fastest feasible trials with distinct routes other than the default's, by the study's own figures:
    a raced trial's refined value (`tuner.study.racing`: its measurements pooled), else its value."""
    seen = {canonical_route(baseline.params)}
    out: list[FrozenTrial] = []
    for t in sorted((t for t in trials if is_feasible(t)), key=lambda t: (refined_value(t, raced or {}), t.number)):
        key = canonical_route(t.params)
        if key not in seen:
            seen.add(key)
            out.append(t)
        if len(out) == top_k:
            break
    return out


def settings(ctx: Context, top_k: int, confidence: float, cap: int) -> dict[str, Any]:
    """What a confirmation depends on besides the trials it re-measures (stored with it; see `is_current`)."""
    return {
        "top_k": top_k,
        "confidence": confidence,
        "cap": cap,
        "min_speedup": MIN_SPEEDUP,
        "measure": measure_settings(ctx.spec),
    }


def is_current(
    ctx: Context, study: optuna.Study, top_k: int = 3, confidence: float = 0.95, rounds: int | None = None
) -> bool:
    """Whether the stored confirmation is of the study as it is: the same default and candidates, the same settings."""
    doc = study.user_attrs.get(A.CONFIRMATION) or {}
    baseline = summarize_study(study).baseline
    if not doc or baseline is None or doc.get("baseline_trial") != baseline.number:
        return False
    trials = study.get_trials(deepcopy=False)
    candidates = pick_candidates(trials, baseline, top_k, races(study)) if is_feasible(baseline) else []
    return doc.get("candidate_trials") == [t.number for t in candidates] and doc.get("settings") == settings(
        ctx, top_k, confidence, DEFAULT_ROUNDS if rounds is None else rounds
    )


Measure = Callable[
    [FrozenTrial, int], J.Result
]  # (candidate trial, round index) -> its paired result against the default


def confirm(
    ctx: Context,
    study: optuna.Study,
    rounds: int | None = None,
    top_k: int = 3,
    confidence: float = 0.95,
    log: Callable[[str], None] = print,
    on_round: Callable[[RoundEvent], None] | None = None,
) -> dict[str, Any]:
    """Re-measure until decided (at most `rounds` rounds, default DEFAULT_ROUNDS), judge, store the "confirmation"
    document, return it.

    Each process is a fresh child on the candidate's stored artifact, paired with the default's
    (`Session`); every finished one is passed to `on_round` (default: its `RoundEvent.text()` to `log`).
    One confirmation of a study runs at a time, on every host (`confirmation_lock`): a second one
    waits, and if the first confirmed the same state of the study with the same settings meanwhile,
    its document is the answer (the study keeps one confirmation, not the last of two).
    """
    seen = (study.user_attrs.get(A.CONFIRMATION) or {}).get("id")
    with confirmation_lock(ctx.url, ctx.spec.study):
        basis = {
            "finished": sum(1 for t in study.get_trials(deepcopy=False) if t.state.is_finished()),
            "rounds": rounds,
            "top_k": top_k,
            "confidence": confidence,
        }
        current = study.user_attrs.get(A.CONFIRMATION) or {}
        if current.get("id") not in (None, seen) and current.get("basis") == basis:
            log("another run confirmed this study while this one waited for it; that confirmation stands")
            return current
        return _confirm(ctx, study, rounds, top_k, confidence, log, on_round, basis)


def _confirm(
    ctx: Context,
    study: optuna.Study,
    rounds: int | None,
    top_k: int,
    confidence: float,
    log: Callable[[str], None],
    on_round: Callable[[RoundEvent], None] | None,
    basis: dict[str, Any],
) -> dict[str, Any]:
    """Measure in fresh children, judge and store (under the confirmation lock); stamped by the database clock."""
    started = time.perf_counter()
    baseline = summarize_study(study).baseline
    with Session(ctx, baseline) if baseline is not None else contextlib.nullcontext() as session:
        doc = judge_study(
            study,
            ctx.spec.objective.statistic,
            session.measure if session else _unmeasured,
            rounds,
            top_k,
            confidence,
            log,
            on_round,
            default_failure=session.default_failure if session else "",
        )
    created = datetime.fromtimestamp(db_now(ctx.url), UTC).isoformat(timespec="seconds")  # one clock for every host
    doc.update(
        settings=settings(ctx, top_k, confidence, DEFAULT_ROUNDS if rounds is None else rounds),
        basis=basis,
        id=session.run_id if session else uuid.uuid4().hex[:12],
        created_at=created,
        seconds=round(time.perf_counter() - started, 2),
    )
    return _store(study, doc)


def _unmeasured(trial: FrozenTrial, r: int) -> J.Result:
    raise AssertionError("nothing is measured without a default route")


def judge_study(
    study: optuna.Study,
    statistic: str,
    measure: Measure,
    rounds: int | None = None,
    top_k: int = 3,
    confidence: float = 0.95,
    log: Callable[[str], None] = print,
    on_round: Callable[[RoundEvent], None] | None = None,
    default_failure: str = "",
    extend: bool = True,
) -> dict[str, Any]:
    """The confirmation document of `study`: its candidates, measured by `measure(candidate, round)` (one process timing
    the candidate paired with the default) until decided, and the verdict (`confirm` runs children; the search
    benchmark replays them). `extend` False: a near tie ends at the cap (the search benchmark's comparison)."""
    cap = DEFAULT_ROUNDS if rounds is None else rounds
    if cap < MIN_ROUNDS:
        raise TunerError(f"--confirm-rounds {cap} is too few: a confirmation needs at least {MIN_ROUNDS} rounds")
    summary = summarize_study(study)
    baseline = summary.baseline
    doc: dict[str, Any] = {
        "confidence": confidence,
        "statistic": statistic,
        "study_best_trial": summary.best.number if summary.best else None,
        "baseline_trial": baseline.number if baseline else None,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    trials = (
        pick_candidates(study.get_trials(deepcopy=False), baseline, top_k, races(study))
        if baseline and is_feasible(baseline)
        else []
    )
    doc["candidate_trials"] = [t.number for t in trials]
    if not trials:
        why = (
            "the default route has no feasible measurement"
            if not baseline or not is_feasible(baseline)
            else "no feasible route other than the default was found"
        )
        return {
            **doc,
            "verdict": NOTHING_TO_CONFIRM,
            "rounds": 0,
            "candidates": [],
            "message": f"nothing to confirm: {why}",
        }
    candidates = [Candidate(t) for t in trials]
    if default_failure:
        return {**doc, **_nothing(candidates, f"the default route failed: {default_failure}")}
    level = interval_level(confidence, len(trials), cap)
    report = on_round or (lambda event: log(event.text()))
    stopped = run_rounds(candidates, measure, cap, level, statistic, report, extend)
    raced = races(study)
    own = {t.number: s for t in trials if (s := standing(t, raced)) is not None}
    return {**doc, **judge(candidates, level, confidence, cap, stopped, statistic, own)}


def run_rounds(
    candidates: list[Candidate],
    measure: Measure,
    cap: int,
    level: float,
    statistic: str,
    report: Callable[[RoundEvent], None],
    extend: bool = True,
) -> str:
    """Rounds of one process per candidate until `decided` at a look (`look_rounds`, each candidate with MIN_ROUNDS)
    or the cap: "decided" or "cap" ("busy" when after MIN_ROUNDS rounds more than BUSY_SHARE of the processes were
    contended). A `settled` candidate is not measured again. At the cap a `near_tie`'s candidates are measured on
    to EXTEND x the cap, with intervals at `extension_level` (`judge` tells by the processes); not with `extend`
    False, which looks after every round to the cap instead."""
    standings: dict[int, Speedup] = {}
    extend = extend and extendable(cap)
    limit, measured = cap, {c.trial.number for c in candidates}
    looks_at = look_rounds(cap, extend)
    r = 0
    while r < limit + CONTENDED_EXTRA:
        live = [
            c
            for c in candidates
            if not c.failure
            and c.trial.number in measured
            and len(c.log_ratios) < limit
            and not (len(c.log_ratios) >= MIN_ROUNDS and settled(c.trial.number, standings))
        ]
        if not live:
            if limit == cap and extend and (tied := near_tie(standings, processes(candidates), cap)):
                limit, looks_at, measured = EXTEND * cap, look_rounds(cap, extended=True), set(tied)
                level = extension_level(level)
                continue
            break
        order = live[r % len(live) :] + live[: r % len(live)]
        for c in order:
            own, contended = _add(c, measure(c.trial, r), statistic)
            standings = {k.trial.number: s for k in candidates if not k.failure and (s := k.pooled(level)) is not None}
            ready = c is order[-1] and all(len(k.log_ratios) >= MIN_ROUNDS for k in candidates if not k.failure)
            why = decided(standings, processes(candidates), limit) if ready and r + 1 in looks_at else ""
            report(RoundEvent(r + 1, limit, c.trial.number, own, contended, c.failure, standings, why))
            if why:
                return "decided"
        contended_n = sum(c.contended for c in candidates)
        timed = contended_n + sum(len(c.log_ratios) for c in candidates)
        if r + 1 >= MIN_ROUNDS and contended_n > BUSY_SHARE * timed:
            # the host's other work keeps the cores: more rounds would mostly be contended too
            return "busy"
        r += 1
    return "cap"


def processes(candidates: list[Candidate]) -> dict[int, int]:
    """How many uncontended processes each candidate's standing pools, by trial number."""
    return {c.trial.number: len(c.log_ratios) for c in candidates}


def extended(candidates: list[Candidate], cap: int) -> bool:
    """Whether the rounds went on past the cap (a `near_tie`): a candidate has more processes than the cap allows."""
    return any(len(c.log_ratios) > cap for c in candidates)


def _add(c: Candidate, res: J.Result, statistic: str) -> tuple[Speedup | None, bool]:
    """Keep one process's result (pooled when uncontended); its own speedup and whether it was contended."""
    p = res.paired
    if res.status != J.OK or not res.latency or not p.get("paired") or not p.get("log_ratios"):
        c.failure = f"{res.status}: {res.message or p.get('unpaired') or 'not timed paired'}"[:300]
        return None, False
    c.loads.append(dict(p.get("contention") or {}))
    low, high = p["ci"]
    own = Speedup(
        float(p["speedup"]), float(low), float(high), float(p.get("confidence", 0.95)), int(p.get("cycles", 0))
    )
    if p.get("contended"):
        c.contended += 1
        return own, True
    c.add(p["log_ratios"], res.latency[statistic], (p.get("baseline_latency") or {}).get(statistic))
    if p.get("shapes"):
        c.shapes.add(p["shapes"])
    return own, False


def judge(
    candidates: list[Candidate],
    level: float,
    confidence: float,
    cap: int,
    stopped: str,
    statistic: str,
    study: Mapping[int, Standing] | None = None,
) -> dict[str, Any]:
    """The verdict and the per-candidate pooled intervals (at `level`, see `interval_level`; at `extension_level`
    when the rounds went on past the cap); among wins it cannot tell apart, the one `named` with the study's own
    measurements (`study`: the candidates' racing standings)."""
    longer = extended(candidates, cap)
    level = extension_level(level) if longer else level
    rows: list[dict[str, Any]] = []
    judged: list[tuple[Candidate, Speedup]] = []
    for c in candidates:
        row: dict[str, Any] = {
            "trial": c.trial.number,
            "route": dict(c.trial.params),
            "study_value": c.trial.value,
            "processes": len(c.log_ratios),
            "contended": c.contended,
        }
        s = None if c.failure else c.pooled(level)
        if s is None:
            row["failure"] = c.failure or "no uncontended measurement"
        else:
            row.update(
                s.to_dict(), median_ms=statistics.median(c.latency_ms), default_median_ms=median_finite(c.default_ms)
            )
            if c.shapes:
                row["shapes"] = c.shapes.rows(level)
            judged.append((c, s))
        rows.append(row)
    rounds = max((len(c.log_ratios) for c in candidates), default=0)
    base = {
        "rounds": rounds,
        "cap": cap,
        "stopped": stopped,
        "candidates": rows,
        "interval_level": level,
        "extended": longer,
        "method": METHOD.format(
            statistic=statistic, level=level, k=len(candidates), looks=looks(cap), min_speedup=MIN_SPEEDUP
        )
        + (EXTENDED.format(rounds=EXTEND * cap, level=level) if longer else ""),
        "default_median_ms": median_finite([v for c in candidates for v in c.default_ms]),
    }
    base["contention"] = contention(candidates)
    if not judged:
        busy = not any(c.failure for c in candidates)  # every process was contended
        why = (
            f"the host was busy throughout: all {base['contention']['processes']} processes were contended by other "
            "work"
            if busy
            else "every candidate failed"
        )
        return {**base, **_nothing(candidates, why)}
    wins = [(c, s) for c, s in judged if is_win(s)]
    fastest = max(wins or judged, key=lambda cs: cs[1].estimate)
    entry, s = named(wins, study or {}) if wins else fastest
    interval = f"{confidence:.0%} CI {s.low:.3f}x-{s.high:.3f}x over {len(entry.log_ratios)} paired processes"
    if wins:
        verdict, message = (
            SPEEDUP,
            f"trial {entry.trial.number} is {s.estimate:.3f}x faster than the default route ({interval})",
        )
        if entry is not fastest[0]:
            message += (
                f", named before trial {fastest[0].trial.number} ({fastest[1].estimate:.3f}x here, not told apart) "
                "as the study's own measurements pooled with these put it ahead"
            )
        close = [f"trial {c.trial.number} {o.estimate:.3f}x" for c, o in wins if c is not entry and o.high >= s.low]
        if close:
            message += f"; as fast within the measurement, and also confirmed: {', '.join(close)}"
    elif all(s.slower for _, s in judged):
        verdict, message = (
            DEFAULT_IS_FASTEST,
            f"the default route is already the fastest: best candidate trial {entry.trial.number} at "
            f"{s.estimate:.3f}x ({interval})",
        )
    else:
        short = "includes 1.0" if not s.significant else f"not clear of the {MIN_SPEEDUP}x a win needs"
        verdict, message = (
            NO_SIGNIFICANT,
            f"no significant speedup over the default route: best candidate trial {entry.trial.number} at "
            f"{s.estimate:.3f}x ({interval} {short})",
        )
    shapes = per_shape(entry.shapes.rows(level))
    if shapes:
        message += f"; per shape: {shapes}"
    if base["contention"].get("contended_processes"):
        c = base["contention"]
        took = f" (other work took {c['others_cores']:.2f} cores on average)" if "others_cores" in c else ""
        message += (
            f"; the host was busy: {c['contended_processes']} of {c['processes']} processes contended{took}, "
            "not counted"
        )
    return {
        **base,
        "verdict": verdict,
        "message": message,
        "trial": entry.trial.number,
        "winner_trial": entry.trial.number if wins else None,
        "speedup": s.estimate,
        "ci": [s.low, s.high],
        "interval_confidence": s.confidence,
    }


def named(wins: list[tuple[Candidate, Speedup]], study: Mapping[int, Standing]) -> tuple[Candidate, Speedup]:
    """The win to name: of those the confirmation cannot tell apart from its fastest (their intervals reach its lower
    bound), the one fastest when its estimate here is pooled with the study's own paired measurements of it (racing's
    standing, `study`), each weighted by the inverse of its variance in log, read from its interval.

    Three processes leave such wins' order to chance: on the recorded MiniLM landscape under a strict tolerance a
    route 13 % faster was named after a slower one (docs/search-efficiency.md); the study's measurements of them,
    re-measured by racing, carry what the confirmation's processes could not. Every one of them is a confirmed win
    either way, and the speedup and interval reported stay the confirmation's."""
    first, best = max(wins, key=lambda cs: cs[1].estimate)
    tied = [(c, s) for c, s in wins if s.high >= best.low]

    def pooled(cs: tuple[Candidate, Speedup]) -> float:
        c, s = cs
        here = (math.log(s.estimate), _log_variance(s.low, s.high, s.confidence))
        own = study.get(c.trial.number)
        if own is None or own.high <= own.low:
            return here[0]
        there = (math.log(own.estimate), _log_variance(own.low, own.high, RACING_CONFIDENCE))
        return (here[0] / here[1] + there[0] / there[1]) / (1 / here[1] + 1 / there[1])

    return max(tied, key=pooled)


def _log_variance(low: float, high: float, confidence: float) -> float:
    """The variance in log that a normal interval [low, high] at `confidence` implies."""
    return (math.log(high / low) / 2 / NormalDist().inv_cdf(0.5 + confidence / 2)) ** 2


def contention(candidates: list[Candidate]) -> dict[str, Any]:
    """How busy the host was during the confirmation: contended processes, and what other work took of the cores."""
    loads = [x for c in candidates for x in c.loads if x.get("measured")]
    out: dict[str, Any] = {
        "processes": sum(len(c.loads) for c in candidates),
        "contended_processes": sum(c.contended for c in candidates),
    }
    if loads:
        shares = [x["study_share"] for x in loads if x.get("study_share") is not None]
        out.update(
            others_cores=round(statistics.mean(x["others_cores"] for x in loads), 4),
            others_cores_max=round(max(x["others_cores_max"] for x in loads), 4),
            study_share=round(statistics.mean(shares), 4) if shares else None,
        )
    return out


def _nothing(candidates: list[Candidate], why: str) -> dict[str, Any]:
    rows = [{"trial": c.trial.number, "route": dict(c.trial.params), "failure": c.failure or why} for c in candidates]
    return {
        "verdict": NOTHING_TO_CONFIRM,
        "message": f"nothing to confirm: on re-measurement {why}",
        "candidates": rows,
        "rounds": max((len(c.log_ratios) for c in candidates), default=0),
    }


class Session:
    """The confirmation's processes: the default's engine to pair with, the run folder, the measurements kept."""

    def __init__(self, ctx: Context, default: FrozenTrial) -> None:
        """The confirmation's processes against `default` (its engine built here if it is not stored on this host)."""
        self.ctx, self.default = ctx, default
        self.store = ResultStore(ctx.url)
        self.run_id = uuid.uuid4().hex[:12]
        self.run_dir = ctx.work_dir / "confirm" / self.run_id
        self.handle = ChildHandle()
        self.default_failure = ""
        self.engine = stored_engine(self.store, default)
        self.log_speedups: dict[int, list[float]] = {}  # each candidate's uncontended processes (`process_target`)

    def __enter__(self) -> Session:
        if self.engine is None:
            self._build_default()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is KeyboardInterrupt:
            self.handle.kill()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def _build_default(self) -> None:
        """The default's engine is not stored on this host: build it once for this confirmation."""
        res = self._run(self.default.params, _artifact(None, self.default), self.run_dir / "default")
        if res.status != J.OK or not res.artifact_path:
            self.default_failure = f"{res.status}: {res.message}"[:300]
            return
        self.engine = {
            "trial": self.default.number,
            "path": res.artifact_path,
            "sha256": res.artifact_sha256,
            "route": dict(self.default.params),
        }

    def _run(
        self,
        route: Mapping[str, Any],
        artifact: tuple[Path | None, str | None],
        trial_dir: Path,
        target: float | None = None,
        **pairing: Any,
    ) -> J.Result:
        """Run `route` once in a fresh child, on its stored `artifact` (path, hash) where that is still here (timed
        to the half-width `target` when given)."""
        job = make_job(self.ctx, dict(route), trial_dir / "out", **pairing)
        if target is not None:
            job.objective = replace(job.objective, target_halfwidth=target)
        job.backend = WRAPPER
        return run_isolated(job, trial_dir, self.handle, reuse_env(self.ctx.spec.backend.name, *artifact))

    def measure(self, candidate: FrozenTrial, r: int) -> J.Result:
        """One process timing `candidate` paired with the default (every other one of a candidate with the engines
        swapped, `Job.swapped`); both engines' samples kept as "confirm" measurements."""
        logs = self.log_speedups.setdefault(candidate.number, [])
        in_study = self.default.value / candidate.value if self.default.value and candidate.value else None
        target = process_target(self.ctx.spec.objective.target_halfwidth, in_study, logs)
        trial_dir = self.run_dir / f"r{r:02d}-{candidate.number:05d}"
        own = stored_engine(self.store, candidate)
        if len(logs) % 2 == 1 and own is not None and self.engine is not None:
            # every other process the engines trade places (`Job.swapped`): the default's is loaded and gated as the
            # route, the candidate's as the baseline, so what either loading path gives its engine cancels
            default_artifact = _artifact(self.engine, self.default)
            res = self._run(self.default.params, default_artifact, trial_dir, target, baseline=own, swapped=True)
        else:
            res = self._run(candidate.params, _artifact(own, candidate), trial_dir, target, baseline=self.engine)
        if res.status == J.OK and res.latency and res.paired.get("paired"):
            if not res.paired.get("contended"):
                logs.append(math.log(float(res.paired["speedup"])))
            key, study, stats = f"confirm-{self.run_id}", self.ctx.spec.study, {"round": r, "paired": _pairing(res)}
            self.store.add_measurement(
                measurement_row(
                    new_run_id(),
                    study,
                    candidate.number,
                    key,
                    "confirm",
                    {**res.latency, **stats},
                    res.samples_ms,
                    res.timing_info,
                )
            )
            self.store.add_measurement(
                measurement_row(
                    new_run_id(),
                    study,
                    self.default.number,
                    key,
                    "confirm",
                    {**res.paired.get("baseline_latency", {}), **stats, "paired_with": candidate.number},
                    res.baseline_samples_ms,
                    res.timing_info,
                )
            )
        return res


def _artifact(engine: Mapping[str, Any] | None, trial: FrozenTrial) -> tuple[Path | None, str | None]:
    """A child's stored artifact (path, hash) from `trial`'s stored engine (`stored_engine`); without one, no path
    (the child builds the route) and the trial's hash."""
    if engine is not None:
        return Path(engine["path"]), engine["sha256"]
    return None, trial.user_attrs.get(A.ARTIFACT_SHA256)


def _pairing(res: J.Result) -> dict[str, Any]:
    return {k: res.paired[k] for k in ("speedup", "ci", "stop", "cycles", "contended", "swapped") if k in res.paired}


def _store(study: optuna.Study, doc: dict[str, Any]) -> dict[str, Any]:
    study.set_user_attr(A.CONFIRMATION, doc)
    return doc
