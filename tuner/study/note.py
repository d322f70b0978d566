"""The study note shown in optuna-dashboard: the study's verdict first, then the best *feasible* trial and the evidence.

optuna-dashboard's own "best trial" ignores feasibility, so the tuner writes the answer into the study
note (Markdown, `optuna_dashboard.save_note`) after every trial and after the confirmation. The note
is the tuner's: edits made in the dashboard are overwritten by the next update.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import optuna

from tuner.study import attrs as A
from tuner.study import optuna_adapter as oa
from tuner.study.summary import Summary
from tuner.study.verdict import Headline, headline_of

log = logging.getLogger("tuner.note")
NOTE_LIMIT = 2000  # one optuna-dashboard note chunk (2045 characters): written in one attribute


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g} ms"


def _best_line(s: Summary) -> str:
    if s.best is None:
        return "**Best feasible trial:** none yet (no route has been timed within the accuracy tolerance)."
    acc = s.best.user_attrs.get(A.ACCURACY) or {}
    accuracy = (
        f"; {acc.get('metric')} {acc.get('value'):.3g} (tolerance {acc.get('tolerance'):g})"
        if isinstance(acc.get("value"), float)
        else ""
    )
    return f"**Best feasible trial: #{s.best.number}**, latency {_ms(s.best_ms)}{accuracy}."


def _study_line(s: Summary, head: Headline) -> str:
    if s.baseline is None:
        return "**Default route:** not finished yet."
    if head.study is None or head.trial is None:
        return (
            f"**Default route:** trial #{s.baseline.number} has no feasible measurement, so no speedup can be stated."
        )
    return (
        f"**As measured in the study:** trial #{head.trial.number} vs the default route (trial #{s.baseline.number}, "
        f"{_ms(s.default_ms)}): {head.study.text()}."
    )


def _confirmation_line(confirmation: dict[str, Any] | None) -> str:
    if not confirmation:
        return (
            "**Confirmation:** not yet. When the budget is spent, `tuner run` re-measures the top candidates against "
            "the default in interleaved fresh processes and states an interval."
        )
    return f"**Confirmation:** {confirmation.get('message', confirmation.get('verdict'))}."


def render_note(s: Summary, confirmation: dict[str, Any] | None, head: Headline, now: datetime | None = None) -> str:
    """The note's Markdown for a study summary, its confirmation document (if any) and its headline."""
    done = s.complete + s.pruned + s.failed
    classes = ", ".join(f"{k} {v}" for k, v in sorted(s.failure_classes.items())) or "none"
    lines = [
        f"## Route Tuner: {s.study}",
        f"**Verdict: {head.verdict}.** {head.sentence}",
        _best_line(s),
        _study_line(s, head),
        _confirmation_line(confirmation),
        f"**Trials:** {done} finished of budget {s.budget} (feasible {s.feasible}, infeasible {s.infeasible}, "
        f"failed {s.failed}), {s.running} running. Failure classes: {classes}.",
    ]
    if s.best is not None:
        route = ", ".join(f"{k}={v}" for k, v in s.best.params.items())
        lines.append(f"**Route of #{s.best.number}:** `{route[:600]}`")
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M:%S UTC")
    lines.append(f"_Written by route-tuner at {stamp}; edits here are overwritten._")
    return "\n\n".join(lines)[:NOTE_LIMIT]


@functools.cache
def _dashboard_notes() -> ModuleType:
    """optuna-dashboard's note module (`optuna_dashboard._note`: the note's attribute names and chunking), loaded alone.

    `import optuna_dashboard` also imports its web application and through it `optuna.importance` and
    scikit-learn: a second of CPU in every worker process, for a module that needs only Optuna. The
    module layout is that of the pinned 0.21 releases.
    """
    if "optuna_dashboard" in sys.modules:  # imported already (the dashboard command): its own
        from optuna_dashboard import _note

        return _note
    package = importlib.util.find_spec("optuna_dashboard")  # found, not imported
    if package is None or package.origin is None:
        raise ModuleNotFoundError("optuna_dashboard")
    spec = importlib.util.spec_from_file_location("optuna_dashboard._note", Path(package.origin).with_name("_note.py"))
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError("optuna_dashboard._note")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _say_the_dashboard_is_missing() -> None:
    """Warn, once per process, that no note can be written."""
    log.warning("optuna-dashboard is not installed here: the study's dashboard note is not written")


def update_note(study: optuna.Study) -> bool:
    """Rewrite the study note from the current trials. Never raises: a note is not worth a trial."""
    try:
        notes = _dashboard_notes()
    except ModuleNotFoundError:
        _say_the_dashboard_is_missing()
        return False
    try:
        attrs = study.user_attrs  # read once: the summary, the headline and the note all need it
        summary, head = headline_of(study.study_name, study.get_trials(deepcopy=False), attrs)
        oa.save_study_note(study, render_note(summary, attrs.get(A.CONFIRMATION), head), notes)
        return True
    except Exception as exc:  # the note is a convenience; the study must go on without it
        log.warning("could not update the study note: %s: %s", type(exc).__name__, exc)
        return False
