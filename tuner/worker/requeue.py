"""Re-queue a trial's route when the trial ended through no fault of the route; count the route's runs.

A route is re-queued when its worker was lost (`tuner.worker.reap`), when the run was stopped or the
machine met an environment error (`tuner.worker.loop`). The retry carries `retry_of` (the trial it
repeats: enqueued once, however often this is called), `attempt` (which run of the route it is; only
runs that ended `lost` count, against `[run] max_attempts`), `env_requeues` and the trial's `source`.
"""

from __future__ import annotations

from typing import Any

import optuna

from tuner.study import attrs as A
from tuner.study import optuna_adapter as oa


def attempt_of(trial: optuna.trial.FrozenTrial) -> int:
    """Which run of its route a trial is, counting the runs that ended `lost` (1 for the first)."""
    return int(trial.user_attrs.get(A.ATTEMPT, 1))


def route_of(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """The route a trial ran (or was enqueued to run, if it died before sampling)."""
    return dict(trial.params) or dict(trial.system_attrs.get("fixed_params", {}))


def requeue(study: optuna.Study, frozen: optuna.trial.FrozenTrial, attempt: int, env_requeues: int = 0) -> None:
    """Enqueue `frozen`'s route as its run `attempt` unless it already was (idempotent on `retry_of`).

    Call with the study lock held.
    """
    params = route_of(frozen)
    if not params:
        return  # it never sampled a route: the sampler proposes afresh
    attrs: dict[str, Any] = {A.RETRY_OF: frozen.number}
    if attempt > 1:
        attrs[A.ATTEMPT] = attempt
    if env_requeues:
        attrs[A.ENV_REQUEUES] = env_requeues
    if frozen.user_attrs.get(A.SOURCE):
        attrs[A.SOURCE] = frozen.user_attrs[A.SOURCE]
    oa.enqueue_retry(study, params, attrs)  # idempotent: an earlier attempt may have enqueued it
