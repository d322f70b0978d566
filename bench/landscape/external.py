"""Other optimisers as the study's sampler, given a fair encoding: knob groups flattened, failures told as failures.

Optuna's GPSampler on the tuner's own encoding sees only the knobs every trial has (conditional ones
drop out of its intersection space) and fits only COMPLETE trials, so the tuner's PRUNED failures,
gate failures and slow trials never reach it. Here an optimiser works on a space of its own: one
categorical per knob group (`tuner.space.groups`), whose values are the group's joint values, so
every parameter is always present; every finished trial is told back to it — a feasible one with its
log latency relative to the baseline's, anything else as a failure in the optimiser's own terms:

- `gp`: Optuna's GPSampler on a shadow study of the flattened space; a failure is COMPLETE with a
  violated constraint (its value: its own latency if it was timed, else the baseline's);
- `smac`: SMAC3's hyperparameter-optimisation facade (random forest, its own initial design) through
  its ask/tell interface; a failure is CRASHED (cost `SMAC_CRASH_COST`).

`ExternalSampler` makes either the tuner's sampler: its proposal becomes the trial's route, so the
study, measurement, racing and delivery around it are the tuner's, as for every other strategy.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Mapping
from typing import Any, Protocol

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.space import SearchSpace, canonical_route
from tuner.space.groups import knob_groups
from tuner.study import racing
from tuner.study.local_search import observation

SMAC_CRASH_COST = 2.0  # log latency relative to the baseline's: a failure counts as 7.4x slower than the default


class Proposer(Protocol):
    """An ask/tell optimiser over the flattened space (one categorical per group, values by index)."""

    def ask(self) -> tuple[Any, list[int]] | None: ...

    def tell(self, handle: Any, values: list[int], log_ratio: float | None, feasible: bool) -> None: ...


class ExternalSampler(optuna.samplers.BaseSampler):
    """A `Proposer` as an Optuna sampler of the study's knob-level routes."""

    def __init__(self, space: SearchSpace, make: Any, seed: int) -> None:
        self.space = space
        self.groups = knob_groups(space)
        default = space.default_route()
        self.choices = [self.groups.values(default, g) for g in self.groups.groups]
        self.proposer: Proposer = make([len(c) for c in self.choices], seed)
        self.asked: dict[int, tuple[Any, list[int]]] = {}

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {p.name: CategoricalDistribution(list(p.choices)) for p in self.space.params if len(p.choices) > 1}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        asked = self.proposer.ask()
        if asked is None:
            return {}  # the optimiser has nothing left to propose: the study's default route (a cache hit)
        handle, values = asked
        self.asked[trial.number] = (handle, values)
        chosen: dict[str, Any] = {}
        for joints, v in zip(self.choices, values):
            chosen.update(joints[v])
        return {k: v for k, v in self.space.complete(chosen).items() if k in search_space}

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self.space.param(param_name).default

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Any) -> None:
        if state not in (TrialState.COMPLETE, TrialState.PRUNED):
            return
        trials = study.get_trials(deepcopy=False)
        base = racing.baseline_trial(trials)
        scale = float(base.value) if base is not None and base.value else (values[0] if values else None)
        o = observation(trial, racing.races(study), scale, state, values[0] if values else None)
        handle, asked = self.asked.pop(trial.number, (None, self.encode(trial.params)))
        if o is not None and asked is not None:
            self.proposer.tell(handle, asked, o.log_ratio, o.feasible)

    def encode(self, route: Mapping[str, Any]) -> list[int] | None:
        """The flattened values of a route the proposer did not ask for (an enqueued one)."""
        out = []
        for g, joints in zip(self.groups.groups, self.choices):
            mine = {k: v for k, v in route.items() if k in g}
            index = next((i for i, j in enumerate(joints) if canonical_route(j) == canonical_route(mine)), None)
            if index is None:
                return None
            out.append(index)
        return out


class ShadowGP:
    """Optuna's GPSampler on a study of its own over the flattened space; failures COMPLETE with a violated
    constraint."""

    def __init__(self, sizes: list[int], seed: int) -> None:
        self.dist = {f"g{i}": CategoricalDistribution(list(range(n))) for i, n in enumerate(sizes) if n > 1}
        self.sizes = sizes
        self.study = optuna.create_study(sampler=optuna.samplers.GPSampler(seed=seed, n_startup_trials=4))
        self.worst = 0.0

    def ask(self) -> tuple[Any, list[int]]:
        t = self.study.ask(self.dist)
        return t, [int(t.params.get(f"g{i}", 0)) for i in range(len(self.sizes))]

    def tell(self, handle: Any, values: list[int], log_ratio: float | None, feasible: bool) -> None:
        value = log_ratio if log_ratio is not None else max(self.worst, 0.0)
        self.worst = max(self.worst, value)
        if handle is None:  # a route the study enqueued: added as a finished trial
            self.study.add_trial(
                optuna.trial.create_trial(
                    params={f"g{i}": v for i, v in enumerate(values) if f"g{i}" in self.dist},
                    distributions=self.dist,
                    value=value,
                    system_attrs={"constraints": [0.0 if feasible else 1.0]},
                )
            )
            return
        handle.set_constraint("feasible", 0.0 if feasible else 1.0)
        self.study.tell(handle, value)


class Smac:
    """SMAC3's hyperparameter-optimisation facade through ask/tell; failures CRASHED."""

    def __init__(self, sizes: list[int], seed: int) -> None:
        from ConfigSpace import Categorical, ConfigurationSpace
        from smac import HyperparameterOptimizationFacade, Scenario

        self.names = [f"g{i}" for i in range(len(sizes))]
        self.sizes = sizes
        cs = ConfigurationSpace(seed=seed)
        cs.add([Categorical(n, [str(v) for v in range(k)]) for n, k in zip(self.names, sizes) if k > 1])
        self.tmp = tempfile.TemporaryDirectory(prefix="smac-")
        scenario = Scenario(
            cs,
            deterministic=True,
            n_trials=100_000,
            seed=seed,
            output_directory=self.tmp.name,
            crash_cost=SMAC_CRASH_COST,
        )
        self.smac = HyperparameterOptimizationFacade(
            scenario, lambda config, seed=0: 0.0, overwrite=True, logging_level=40
        )
        self.cs = cs

    def ask(self) -> tuple[Any, list[int]] | None:
        from smac.main.exceptions import ConfigurationSpaceExhaustedException

        try:
            info = self.smac.ask()
        except (ConfigurationSpaceExhaustedException, StopIteration):
            return None  # SMAC proposes no configuration twice: it has tried them all
        return info, [int(info.config.get(n, "0")) for n in self.names]

    def tell(self, handle: Any, values: list[int], log_ratio: float | None, feasible: bool) -> None:
        from ConfigSpace import Configuration
        from smac.runhistory import StatusType, TrialInfo, TrialValue

        if handle is None:
            config = Configuration(self.cs, {n: str(v) for n, v, k in zip(self.names, values, self.sizes) if k > 1})
            handle = TrialInfo(config, seed=0)
        ok = feasible and log_ratio is not None and math.isfinite(log_ratio)
        self.smac.tell(
            handle,
            TrialValue(
                cost=log_ratio if ok else SMAC_CRASH_COST, status=StatusType.SUCCESS if ok else StatusType.CRASHED
            ),
        )


def smac_sampler(space: SearchSpace, seed: int) -> optuna.samplers.BaseSampler:
    """SMAC3 as the study's sampler (flattened groups)."""
    return ExternalSampler(space, Smac, seed)


def gp_sampler(space: SearchSpace, seed: int) -> optuna.samplers.BaseSampler:
    """Optuna's GPSampler as the study's sampler, with the fair encoding (flattened groups, failures as constraints)."""
    return ExternalSampler(space, ShadowGP, seed)
