"""One conclusion for every surface: `tuner best`, `tuner status`, the dashboard note and the report.

The verdict comes from the end-of-study confirmation when there is one, else from the study itself:

- ``speedup``: a candidate's confirmed interval lies above 1.0 — use that route;
- ``no-significant-speedup``: no candidate's interval clears 1.0 — keep the default route;
- ``default-is-fastest``: every candidate is confirmed slower (or no other route was feasible) — keep the default;
- ``unconfirmed``: no confirmation yet (or it could not judge): the study's own estimate, not to be acted on.

`speedup` is the confirmed estimate where a confirmation exists, else the study's estimate for the same
route; `study_speedup` is always the study's estimate: the trial's paired ratio against the baseline
engine, refined where racing re-measured it (`tuner.study.racing.standing`), else the ratio of the
default's and the trial's values, each measured once and apart in time. Before a confirmation the
headline is about racing's confirmed best where there is one, else the study's best feasible trial.
With `[[objective.shapes]]` the headline keeps the per-shape figures its estimate stands on (`shapes`,
where from in `shapes_from`): the confirmation's for a confirmed route; else, for a trial racing
re-measured, racing's pooled figures (`tuner.study.racing`, `A.SHAPES_REFINED`); else the trial's own.
Its sentence says them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from tuner.measure.shapes import per_shape
from tuner.study import attrs as A
from tuner.study.outcome import is_feasible
from tuner.study.racing import Races, best_confirmed, races_in, standing
from tuner.study.summary import Summary, summarize_trials

SPEEDUP = "speedup"
NO_SIGNIFICANT = "no-significant-speedup"
DEFAULT_IS_FASTEST = "default-is-fastest"
UNCONFIRMED = "unconfirmed"
VERDICTS = (SPEEDUP, NO_SIGNIFICANT, DEFAULT_IS_FASTEST, UNCONFIRMED)
FROM_CONFIRMATION, FROM_RACING, FROM_TRIAL = "confirmation", "racing", "trial"  # where a headline's `shapes` come from
Shapes = tuple[tuple[Mapping[str, Any], ...], str]  # per-shape figures and where they come from
LEGACY = {"default-fastest": DEFAULT_IS_FASTEST}  # what confirmations stored before the names were unified


@dataclass(frozen=True)
class Estimate:
    """A speedup over the default route (default latency / route latency), with its interval where one exists."""

    speedup: float
    low: float | None = None
    high: float | None = None
    paired: bool = False  # measured side by side with the default (an interval), not two separate trials

    @property
    def ci(self) -> list[float] | None:
        """[low, high], or None when there is no interval."""
        return None if self.low is None or self.high is None else [self.low, self.high]

    def text(self) -> str:
        """'1.23x (95% CI 1.10x-1.35x)' or '1.23x (unpaired)'."""
        if self.ci is None:
            return f"{self.speedup:.2f}x ({'paired' if self.paired else 'unpaired: each measured once, apart in time'})"
        return f"{self.speedup:.2f}x (CI {self.low:.2f}x-{self.high:.2f}x)"


@dataclass(frozen=True)
class Headline:
    """The study's one conclusion and what it rests on."""

    verdict: str
    sentence: str  # one sentence a user can act on
    trial: FrozenTrial | None  # the route the verdict is about (winner, best candidate, or the study's best)
    estimate: Estimate | None  # the speedup the verdict stands on: confirmed, else the study's
    study: Estimate | None  # the study's own estimate for `trial`
    export_trial: int | None  # what `tuner best --export` writes: the winner, the default route, or None
    baseline_trial: int | None
    shapes: tuple[Mapping[str, Any], ...] = ()  # per shape: inputs, weight, speedup, ci, route_ms, default_ms
    shapes_from: str = ""  # FROM_CONFIRMATION, FROM_RACING or FROM_TRIAL; "" without per-shape figures

    def to_json(self) -> dict[str, Any]:
        """The verdict keys of `tuner best --json` and `tuner status --json`."""
        return {
            "verdict": self.verdict,
            "speedup": self.estimate.speedup if self.estimate else None,
            "speedup_ci": self.estimate.ci if self.estimate else None,
            "study_speedup": self.study.speedup if self.study else None,
            "study_speedup_ci": self.study.ci if self.study else None,
            "verdict_trial": self.trial.number if self.trial else None,
            "export_trial": self.export_trial,
            "headline": self.sentence,
        }


def verdict_name(stored: str | None) -> str | None:
    """A stored confirmation's verdict under the current names."""
    return LEGACY.get(stored or "", stored)


def study_estimate(
    trial: FrozenTrial | None, baseline: FrozenTrial | None, races: Races | None = None
) -> Estimate | None:
    """The study's own speedup estimate for `trial`: its paired standing (refined by racing), else the ratio of
    values."""
    if trial is None:
        return None
    paired = standing(trial, races or {})
    if paired is not None:
        return Estimate(paired.estimate, paired.low, paired.high, paired=True)
    if baseline is None or not is_feasible(baseline) or not is_feasible(trial):
        return None
    if trial.number == baseline.number:
        return Estimate(1.0, 1.0, 1.0, paired=True)
    if _positive(baseline.value) and _positive(trial.value):
        return Estimate(float(baseline.value) / float(trial.value))  # type: ignore[arg-type]
    return None


def study_headline(study: optuna.Study) -> tuple[Summary, Headline]:
    """A fresh read of `study`: its summary and its headline."""
    return headline_of(study.study_name, study.get_trials(deepcopy=False), study.user_attrs)


def headline_of(name: str, trials: Sequence[FrozenTrial], attrs: Mapping[str, Any]) -> tuple[Summary, Headline]:
    """Study `name`'s summary and headline from its trials and user attributes (read once by the caller)."""
    summary = summarize_trials(name, trials, attrs)
    return summary, decide(summary, attrs.get(A.CONFIRMATION), trials, races_in(attrs))


def decide(
    summary: Summary, confirmation: Mapping[str, Any] | None, trials: Sequence[FrozenTrial], races: Races | None = None
) -> Headline:
    """The headline of a study from its summary, its stored confirmation (if any), its trials and racing document."""
    by_number = {t.number: t for t in trials}
    baseline = summary.baseline
    base_no = baseline.number if baseline else None
    conf = dict(confirmation or {})
    verdict = verdict_name(conf.get("verdict"))
    if verdict in (SPEEDUP, NO_SIGNIFICANT, DEFAULT_IS_FASTEST) and by_number.get(conf.get("trial")) is not None:
        trial = by_number[conf["trial"]]
        low, high = (conf.get("ci") or [None, None])[:2]
        confirmed = Estimate(float(conf["speedup"]), low, high, paired=True)
        export = trial.number if verdict == SPEEDUP else base_no
        row = next((r for r in conf.get("candidates") or [] if r.get("trial") == trial.number), {})
        shapes, source = (
            (tuple(row["shapes"]), FROM_CONFIRMATION) if row.get("shapes") else racing_shapes(trial, races or {})
        )
        sentence = (
            _confirmed_sentence(verdict, trial.number, confirmed, conf)
            + _per_shape(shapes, source)
            + _stale(summary, conf)
        )
        return Headline(
            verdict,
            sentence,
            trial,
            confirmed,
            study_estimate(trial, baseline, races),
            export,
            base_no,
            shapes,
            source,
        )
    if (
        conf
        and not conf.get("candidates")
        and baseline is not None
        and is_feasible(baseline)
        and _only_default(summary)
    ):
        sentence = "Keep the default route: no other route was feasible within the accuracy tolerance."
        return Headline(
            DEFAULT_IS_FASTEST,
            sentence,
            baseline,
            Estimate(1.0, 1.0, 1.0, paired=True),
            study_estimate(baseline, baseline, races),
            base_no,
            base_no,
        )
    best = (
        best_confirmed(trials, races or {}) or summary.best
    )  # racing's confirmed best, else the study's best feasible
    study = study_estimate(best, baseline, races)
    shapes, source = study_shapes(best, races or {}) if best is not None else ((), "")
    sentence = _unconfirmed_sentence(summary, best, study, conf) + _per_shape(shapes, source)
    return Headline(UNCONFIRMED, sentence, best, study, study, None, base_no, shapes, source)


def racing_shapes(trial: FrozenTrial, races: Races) -> Shapes:
    """Racing's pooled per-shape figures for `trial` (FROM_RACING), or ((), "") where racing has none."""
    refined = (races.get(str(trial.number)) or {}).get(A.SHAPES_REFINED)
    return (tuple(refined), FROM_RACING) if refined else ((), "")


def study_shapes(trial: FrozenTrial, races: Races) -> Shapes:
    """The study's own per-shape figures for `trial`: racing's pooled ones where racing re-measured it (as
    `study_estimate` is racing's refined speedup), else its own timing's (FROM_TRIAL); ((), "") without."""
    refined = racing_shapes(trial, races)
    if refined[0]:
        return refined
    own = tuple(trial.user_attrs.get(A.SHAPES) or ())
    return own, FROM_TRIAL if own else ""


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _only_default(summary: Summary) -> bool:
    return summary.best is not None and summary.baseline is not None and summary.best.number == summary.baseline.number


def _interval(conf: Mapping[str, Any], est: Estimate) -> str:
    confidence = conf.get("confidence")
    level = f"{confidence:.0%} " if isinstance(confidence, float) else ""
    return (
        f"{level}CI {est.low:.2f}x-{est.high:.2f}x over {conf.get('rounds')} interleaved rounds"
        if est.ci
        else "no interval"
    )


def _confirmed_sentence(verdict: str, trial: int, est: Estimate, conf: Mapping[str, Any]) -> str:
    interval = _interval(conf, est)
    if verdict == SPEEDUP:
        return (
            f"Use trial {trial}: confirmed {est.speedup:.2f}x faster than the default route ({interval}); "
            "`tuner best --export DIR` writes it."
        )
    if verdict == NO_SIGNIFICANT:
        return (
            f"Keep the default route: no route is significantly faster (best candidate, trial {trial}, "
            f"{est.speedup:.2f}x, {interval}); `tuner best --export DIR` writes the default route."
        )
    return (
        f"Keep the default route: it is the fastest (best candidate, trial {trial}, {est.speedup:.2f}x, {interval}); "
        "`tuner best --export DIR` writes the default route."
    )


def _per_shape(shapes: Sequence[Mapping[str, Any]], source: str) -> str:
    text = per_shape(shapes)
    if not text:
        return ""
    return f" Per shape, racing's re-measurements pooled: {text}." if source == FROM_RACING else f" Per shape: {text}."


def _stale(summary: Summary, conf: Mapping[str, Any]) -> str:
    if summary.best is None or conf.get("study_best_trial") in (None, summary.best.number):
        return ""
    return f" Trial {summary.best.number}, found since, is not confirmed: run `tuner run` again to re-confirm."


def _unconfirmed_sentence(
    summary: Summary, best: FrozenTrial | None, study: Estimate | None, conf: Mapping[str, Any]
) -> str:
    if best is None:
        return "Nothing to act on yet: no route has been timed within the accuracy tolerance."
    why = f" ({conf['message']})" if conf.get("message") else ""
    if summary.baseline is not None and best.number == summary.baseline.number:
        return (
            f"Not confirmed{why}: the default route (trial {best.number}) is the fastest feasible route the study "
            "found."
        )
    if study is None:
        return (
            f"Not confirmed: the default route has no feasible measurement, so no speedup can be stated{why}; "
            f"the fastest feasible route is trial {best.number}."
        )
    return (
        f"Not confirmed{why}: trial {best.number} measured {study.text()} against the default route in the study; "
        "`tuner run` re-measures the top routes against the default when the budget is spent — act on that, not on "
        "this."
    )


def confirmed_row(doc: dict[str, Any], trial: int | None) -> dict[str, Any] | None:
    """The confirmation's row of a verdict document (`tuner best --json`) for `trial` where it measured the route
    (`median_ms`, the default's `default_median_ms`, `speedup`, `low`, `high`, `processes`), else None."""
    rows = (doc.get("confirmation") or {}).get("candidates") or ()
    return next((r for r in rows if r.get("trial") == trial and r.get("median_ms") is not None), None)
