"""The documents a study is read as: its status, its verdict (`tuner best --json`), its trials.

These are stable: keys may be added, never renamed. `tuner.api.Study` returns them and the CLI
prints them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import optuna

from tuner.errors import TunerError, first_line
from tuner.events import changes, outcome
from tuner.study import attrs as A
from tuner.study.outcome import is_feasible, measured_latency
from tuner.study.racing import baseline_trial, races
from tuner.study.summary import Summary
from tuner.study.verdict import Headline, study_estimate, study_headline

if TYPE_CHECKING:
    from tuner.study.setup import Context


def timed_headline(ctx: Context, study: optuna.Study) -> tuple[Summary, Headline]:
    """The study's summary and headline, its sentence ending with the share of the machine the study was timed with
    (`tuner.export.machine_share`, in the export README's words)."""
    from tuner.export import machine_share
    from tuner.export.readme import share_line

    s, head = study_headline(study)
    share = share_line(machine_share(ctx, head.trial))
    return s, replace(head, sentence=f"{head.sentence} The study was {share}.")


def status_document(ctx: Context, study: optuna.Study) -> dict[str, Any]:
    """`tuner status --json`: counts by state, best so far, elapsed time, and the verdict."""
    s, head = timed_headline(ctx, study)
    return {**s.status_json(), **head.to_json()}


def verdict_document(ctx: Context, study: optuna.Study) -> tuple[dict[str, Any], Headline]:
    """`tuner best --json` about the route the verdict is about, and the verdict; with no feasible trial
    yet, the same keys about no route (trial, route and value None)."""
    from tuner.export import machine_share, measured_shapes

    s, head = timed_headline(ctx, study)
    confirmation = study.user_attrs.get(A.CONFIRMATION)
    trial = head.trial or s.best
    acc = trial.user_attrs.get(A.ACCURACY, {}) if trial else {}
    attr = trial.user_attrs.get if trial else (lambda key, default=None: default)
    doc = {
        "study": s.study,
        "trial": trial.number if trial else None,
        "route": trial.params if trial else None,
        "default_route": dict(study.user_attrs.get(A.DEFAULT_ROUTE) or {}),
        "value": trial.value if trial else None,
        "baseline_value": s.baseline_value,
        "measured_ms": attr(A.MEASURED_MS),
        "default_ms": s.default_ms,
        "contention": (confirmation or {}).get("contention"),
        "accuracy": {
            "metric": acc.get("metric", ctx.spec.accuracy.metric),
            "value": acc.get("value"),
            "tolerance": ctx.spec.accuracy.tolerance,
        },
        "feasible": bool(trial and is_feasible(trial)),
        "statistic": ctx.spec.objective.statistic,
        "unit": "ms",
        "latency_ms": attr(A.LATENCY_MS),
        "artifact_sha256": attr(A.ARTIFACT_SHA256),
        "artifact_bytes": attr(A.ARTIFACT_BYTES),
        "peak_memory_mb": attr(A.PEAK_MEMORY_MB),
        "memory_kind": attr(A.MEMORY_KIND),
        "max_memory_mb": ctx.spec.objective.max_memory_mb,
        "shapes": measured_shapes(ctx, trial, head.shapes if head.trial is trial else ()),
        "shapes_from": head.shapes_from or None,
        "machine_share": machine_share(ctx, trial),
        "baseline_trial": s.baseline.number if s.baseline else None,
        "study_best_trial": s.best.number if s.best else None,
        "confirmation": confirmation,
        **head.to_json(),
    }
    return doc, head


def best_document(ctx: Context, study: optuna.Study) -> tuple[dict[str, Any], Headline]:
    """The verdict document; TunerError while the study has no feasible trial."""
    doc, head = verdict_document(ctx, study)
    if doc["study_best_trial"] is None:
        raise TunerError(f"study {doc['study']!r} has no feasible trial yet")
    return doc, head


def trial_documents(study: optuna.Study) -> list[dict[str, Any]]:
    """Every trial: number, state, outcome, route and its changes from the default, value (the study's objective),
    latency_ms and default_ms (the trial's and the default route's, as the trial's own uncontended timing measured
    them), speedup, message."""
    trials = study.get_trials(deepcopy=False)
    default = dict(study.user_attrs.get(A.DEFAULT_ROUTE) or {})
    base, raced = baseline_trial(trials), races(study)
    out = []
    for t in sorted(trials, key=lambda t: t.number):
        est = study_estimate(t, base, raced) if is_feasible(t) else None
        out.append(
            {
                "number": t.number,
                "state": t.state.name.lower(),
                "outcome": outcome(t) if t.state.is_finished() else t.state.name.lower(),
                "source": t.user_attrs.get(A.SOURCE, "sampler"),
                "route": t.params,
                "changes": changes(t, default),
                "value": t.value,
                "latency_ms": measured_latency(t),
                "default_ms": measured_latency(t, "default"),
                "speedup": est.speedup if est else None,
                "speedup_ci": est.ci if est else None,
                "accuracy": (t.user_attrs.get(A.ACCURACY) or {}).get("value"),
                "duration_s": t.duration.total_seconds() if t.duration else None,
                "message": first_line(str(t.user_attrs.get(A.MESSAGE, ""))),
            }
        )
    return out
