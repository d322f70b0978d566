"""Warm start: a new study starts from the finished studies of *other* models on the same kind of device.

With `[run] warm_start = "auto"` (the default is "off": in the search benchmark it took more builds than a
cold start, docs/search-efficiency.md), a study created in a storage that already holds studies of the same
backend on the same kind of device (`device_kind`) but of another model (`model_sha256`) takes two things from
each of them:

- its winner (the confirmed winner of its end-of-study confirmation, else racing's confirmed best),
  projected onto the new space — each knob the new space has keeps the winner's value where the new
  space allows it, every other knob takes its default — enqueued right after the default route and the
  backend's recommended routes (`source` "warm-start");
- its outcomes as observations for the sampler (`tuner.study.local_search`): every finished trial's
  route projected the same way, its log latency relative to its own study's baseline and whether it
  was feasible; the sampler weighs them below the study's own and less as its own accumulate.

What was used is recorded on the new study (user attribute `warm_start`: its sources and the
observations), so a resumed study keeps it and the dashboard shows it. A study of the same model is
never a source: a warm start must be validated on a model it did not come from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import optuna

from tuner.space import Route, SearchSpace, canonical_route
from tuner.study import attrs as A
from tuner.study import racing
from tuner.study.local_search import observation

SOURCE = "warm-start"


def device_kind(device: Mapping[str, Any]) -> str:
    """A device fingerprint as one comparable string (the replay marker left out)."""
    return json.dumps({k: v for k, v in device.items() if k != "replay"}, sort_keys=True, default=str)


def identity(model_sha: str, device: Mapping[str, Any]) -> dict[str, str]:
    """The study attributes a warm start matches on."""
    return {A.MODEL_SHA256: model_sha, A.DEVICE_KIND: device_kind(device)}


def project(route: Mapping[str, Any], space: SearchSpace) -> Route:
    """`route` on `space`: its values where the space has the knob and allows the value, the default elsewhere."""
    allowed = {p.name: p.choices for p in space.params}
    return space.complete(
        {k: v for k, v in route.items() if k in allowed and any(type(v) is type(c) and v == c for c in allowed[k])}
    )


def winner(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """A finished study's winner: its confirmed winner, else racing's confirmed best, else None."""
    trials = study.get_trials(deepcopy=False)
    confirmation = study.user_attrs.get(A.CONFIRMATION) or {}
    number = confirmation.get("winner_trial")
    if number is not None:
        return next((t for t in trials if t.number == number), None)
    return racing.best_confirmed(trials, racing.races(study))


def sources(
    storage: optuna.storages.BaseStorage, name: str, backend: str, attrs: Mapping[str, str]
) -> list[optuna.Study]:
    """The other studies in `storage` a new study `name` may start from: same backend and kind of device, another
    model."""
    out = []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        a = summary.user_attrs
        if (
            summary.study_name != name
            and a.get(A.BACKEND) == backend
            and a.get(A.DEVICE_KIND) == attrs[A.DEVICE_KIND]
            and a.get(A.MODEL_SHA256) not in (None, attrs[A.MODEL_SHA256])
        ):
            out.append(optuna.load_study(study_name=summary.study_name, storage=storage))
    return out


def observations(study: optuna.Study, space: SearchSpace) -> list[dict[str, Any]]:
    """Every finished trial of `study` as an observation on `space` (log latency relative to its baseline,
    feasibility)."""
    trials = study.get_trials(deepcopy=False)
    base = racing.baseline_trial(trials)
    scale = float(base.value) if base is not None and base.value else None
    raced = racing.races(study)
    out = []
    for t in trials:
        o = observation(t, raced, scale)
        if o is not None:
            out.append({"route": project(o.route, space), "log_ratio": o.log_ratio, "feasible": o.feasible})
    return out


def warm_start(
    study: optuna.Study,
    storage: optuna.storages.BaseStorage,
    space: SearchSpace,
    backend: str,
    attrs: Mapping[str, str],
) -> dict[str, Any]:
    """Enqueue the sources' projected winners (after what is already queued) and record the sources and their
    observations on `study`; the document recorded (no sources: nothing enqueued, an empty list recorded)."""
    found = sources(storage, study.study_name, backend, attrs)
    queued = {canonical_route(t.system_attrs.get("fixed_params", {})) for t in study.get_trials(deepcopy=False)}
    doc: dict[str, Any] = {"sources": [], "observations": []}
    for source in found:
        best = winner(source)
        entry: dict[str, Any] = {"study": source.study_name, "winner_trial": best.number if best is not None else None}
        if best is not None:
            route = project(best.params, space)
            entry["winner"] = route
            if canonical_route(route) not in queued:
                study.enqueue_trial(route, user_attrs={A.SOURCE: SOURCE, A.WARM_START_FROM: source.study_name})
                queued.add(canonical_route(route))
        doc["sources"].append(entry)
        doc["observations"] += observations(source, space)
    study.set_user_attr(A.WARM_START, doc)
    return doc
