"""What a running study reports as it goes: finished trials, phases, confirmation rounds.

`Study.run(callbacks=...)` passes each event to every callback as it happens: a `TrialEvent` for
every trial that finishes, a `PhaseEvent` when the run moves on (trials, confirming, done), and the
confirmation's own `tuner.worker.confirm.RoundEvent` for every re-measuring process. Each has
`text()` (one line for a log) and `to_json()` (one object for machines).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import first_line
from tuner.study import attrs as A
from tuner.study.outcome import UNCOUNTED, is_feasible
from tuner.study.racing import baseline_trial, races
from tuner.study.verdict import Estimate, study_estimate

TRIALS, CONFIRMING, DONE = "trials", "confirming", "done"
SHORT = 3  # route changes a trial line names (the rest counted); -v names them all


@dataclass(frozen=True)
class TrialEvent:
    """One trial finished: what it changed from the default route, how it ended, and how far the study is."""

    number: int
    route: dict[str, Any]
    changes: dict[str, Any]  # the route's values that differ from the default route's
    outcome: str  # "feasible", else the failure class ("accuracy-gate", "build-error", "interrupted", ...)
    value: float | None
    speedup: Estimate | None
    message: str  # the failure's first line ("" for a feasible trial)
    done: int  # trials finished and counted in the budget
    budget: int
    eta_s: float | None  # the budget left times the median trial time, over the workers

    def text(self, full_route: bool = False) -> str:
        """'trial 3 [precision=int8_static]: feasible, 1.21x (CI 1.10x-1.32x) (3/8, ETA 40 s)'; the whole route
        with `full_route`, else what it changes from the default."""
        shown = list((self.route if full_route else self.changes).items())
        if not full_route and len(shown) > SHORT:
            shown, more = shown[:SHORT], [("", f"+{len(shown) - SHORT} more")]
            shown += more
        route = ", ".join(f"{k}={v}" if k else v for k, v in shown) or "default route"
        if self.outcome == "feasible":
            result = "feasible" + (f", {self.speedup.text()}" if self.speedup else "")
        else:
            result = self.outcome + (f": {self.message}" if self.message else "")
        eta = f", ETA {self.eta_s:.0f} s" if self.eta_s is not None and self.done < self.budget else ""
        return f"trial {self.number} [{route}]: {result} ({self.done}/{self.budget}{eta})"

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["speedup"] = self.speedup.speedup if self.speedup else None
        doc["speedup_ci"] = self.speedup.ci if self.speedup else None
        return {"event": "trial", **doc}


@dataclass(frozen=True)
class PhaseEvent:
    """The run moved on to `phase` (trials, confirming, done); `detail` says what it does there."""

    phase: str
    detail: str = ""

    def text(self) -> str:
        return f"{self.phase}: {self.detail}" if self.detail else self.phase

    def to_json(self) -> dict[str, Any]:
        return {"event": "phase", "phase": self.phase, "detail": self.detail}


def event_json(event: Any) -> dict[str, Any]:
    """Any event as one JSON-ready object (a confirmation round included)."""
    if hasattr(event, "to_json"):
        return event.to_json()
    doc = asdict(event) if is_dataclass(event) else {"text": str(event)}
    doc["standings"] = {str(k): v for k, v in doc.get("standings", {}).items()}
    return {"event": type(event).__name__.removesuffix("Event").lower(), **doc, "text": event.text()}


def outcome(t: FrozenTrial) -> str:
    """A finished trial's outcome in one word."""
    if is_feasible(t):
        return "feasible"
    return str(t.user_attrs.get(A.FAILURE_CLASS) or ("infeasible" if t.state == TrialState.COMPLETE else t.state.name))


def changes(t: FrozenTrial, default: dict[str, Any]) -> dict[str, Any]:
    """The trial's parameters that differ from the default route."""
    return {k: v for k, v in t.params.items() if default.get(k) != v}


@dataclass
class TrialWatcher:
    """Turns a study's freshly read trials into one `TrialEvent` per trial that finished since the last look."""

    study: optuna.Study
    budget: int
    workers: int = 1
    seen: set[tuple[int, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.seen = {_key(t) for t in self.study.get_trials(deepcopy=False) if t.state.is_finished()}

    def poll(self) -> list[TrialEvent]:
        trials = self.study.get_trials(deepcopy=False)
        new = sorted((t for t in trials if t.state.is_finished() and _key(t) not in self.seen), key=lambda t: t.number)
        if not new:
            return []
        self.seen.update(_key(t) for t in new)
        default = dict(self.study.user_attrs.get(A.DEFAULT_ROUTE) or {})
        base, raced = baseline_trial(trials), races(self.study)
        counted = [t for t in trials if t.state.is_finished() and _counts(t)]
        durations = [t.duration.total_seconds() for t in counted if t.duration]
        left = max(0, self.budget - len(counted))
        eta = statistics.median(durations) * left / max(1, self.workers) if durations else None
        done = len(counted) - sum(map(_counts, new))  # each event counts the trials up to its own
        events = []
        for t in new:
            done += _counts(t)
            events.append(
                TrialEvent(
                    number=t.number,
                    route=dict(t.params),
                    changes=changes(t, default),
                    outcome=outcome(t),
                    value=t.value,
                    speedup=study_estimate(t, base, raced) if is_feasible(t) else None,
                    message="" if is_feasible(t) else first_line(str(t.user_attrs.get(A.MESSAGE, ""))),
                    done=done,
                    budget=self.budget,
                    eta_s=eta,
                )
            )
        return events


def _key(t: FrozenTrial) -> tuple[int, str]:
    return t.number, t.state.name


def _counts(t: FrozenTrial) -> bool:
    """Whether a finished trial counts towards the budget (a re-queued one does not)."""
    return t.user_attrs.get(A.FAILURE_CLASS) not in UNCOUNTED
