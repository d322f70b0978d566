"""Sampler construction: a distinct seed per worker and per restart, constraint-aware by default.

Model-based samplers are wrapped in `NoRepeatSampler`: in a discrete route space TPE keeps
re-proposing routes already built (a cache hit teaches it nothing and uses a trial of the budget).
Measured on recorded landscapes (docs/search-efficiency.md, 20 seeds): building an untried neighbour
instead took TPE from 2.3-3 trials per build (300 trials for 80 builds on MiniLM) to 1.03-1.08, and
the median builds until the best route from 94/22/21/48 to 32/16/20/31 on the four scenarios.

The default sampler is "local" (`tuner.study.local_search`: a local search over knob groups ranked by
random forests and additive models, feasibility learnt in two stages, every model seeing sub-knobs within
their variant), measured by the route it *delivers* through the tuner's own study code on the recorded
landscapes (`bench/results/search-efficiency.json`, docs/search-efficiency.md, which also says where
it misses the goal and what the project's choice rule says of it).
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.space import SearchSpace
from tuner.spec import RunSpec


def make_sampler(run: RunSpec, worker_index: int, space: SearchSpace | None = None) -> optuna.samplers.BaseSampler:
    """The study's sampler for one worker process (`space`: the study's search space, which "local" needs).

    Seeds mix the study seed, the worker index, the process id and the host name, so workers, restarts
    and hosts never replay one another's proposals (a fixed seed re-proposes the first configurations
    after a restart; containers of a fleet start their workers with the same index and process id).
    """
    host = zlib.crc32(socket.gethostname().encode())
    return sampler_for(run, (run.seed * 1_000_003 + worker_index * 7919 + os.getpid() + host) % (2**31), space)


def sampler_for(run: RunSpec, seed: int, space: SearchSpace | None = None) -> optuna.samplers.BaseSampler:
    """The study's sampler with an explicit `seed` (what `make_sampler` builds; benchmarks call it to repeat runs)."""
    if run.sampler == "local":
        if space is None:
            raise ValueError("the local-search sampler needs the study's search space")
        from tuner.study.local_search import LocalSearchSampler

        return NoRepeatSampler(LocalSearchSampler(space, seed), seed)
    if run.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if run.sampler == "gp":
        if "OMP_NUM_THREADS" not in os.environ:  # the user's choice stands
            import torch

            torch.set_num_threads(1)  # this process's own: a variable set here would reach every trial child
        return NoRepeatSampler(optuna.samplers.GPSampler(seed=seed, n_startup_trials=run.startup_trials), seed)
    return NoRepeatSampler(
        optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=run.startup_trials, multivariate=True, group=True, constant_liar=True
        ),
        seed,
    )


ENUMERATE_UP_TO = 4096  # spaces up to this many routes are searched exhaustively for an untried route
FAR_DRAWS = 512


class NoRepeatSampler(optuna.samplers.BaseSampler):
    """Delegates to `base`, but a relative proposal equal to a route already tried (finished or running)
    is replaced by a random untried neighbour: the proposal with one knob changed, else two, else the
    nearest untried route farther away (`_farther`)."""

    def __init__(self, base: optuna.samplers.BaseSampler, seed: int | None = None) -> None:
        self.base = base
        self.rng = np.random.default_rng(seed)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        """The base's space; before any trial has finished (the base then has none), the running trials' knobs,
        so the first proposals of parallel workers are drawn here and kept from repeating one another."""
        space = self.base.infer_relative_search_space(study, trial)
        if space or study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            return space  # an independent base (no relative space) keeps sampling on its own once it has history
        return _space_of_running(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        proposal = self.base.sample_relative(study, trial, search_space)
        if not proposal and search_space:  # the base's random start-up: a uniform draw, kept from repeating below
            proposal = {
                n: d.choices[int(self.rng.integers(len(d.choices)))]
                for n, d in search_space.items()
                if hasattr(d, "choices")
            }  # type: ignore[attr-defined]
        tried = [
            {k: v for k, v in t.params.items() if k in search_space}
            for t in study.get_trials(
                deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
            )
            if t.number != trial.number
        ]
        if not proposal or not _repeats(proposal, tried):
            return proposal
        ring = [proposal]
        for _ in range(2):
            ring = [n for p in ring for n in _neighbours(p, search_space)]
            self.rng.shuffle(ring)  # type: ignore[arg-type]
            fresh = next((n for n in ring if not _repeats(n, tried)), None)
            if fresh is not None:
                return fresh
            ring = ring[:64]
        return self._farther(proposal, search_space, tried) or proposal

    def _farther(
        self, proposal: dict[str, Any], space: Mapping[str, BaseDistribution], tried: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """An untried route nearest to `proposal` (fewest knobs changed) when none is within two knobs.

        Small spaces are enumerated, so a study never repeats a route while an untried one exists;
        larger ones are sampled (FAR_DRAWS random routes). None when nothing untried was found.
        """
        names = [n for n in space if n in proposal and hasattr(space[n], "choices")]
        size = math.prod(len(space[n].choices) for n in names)  # type: ignore[attr-defined]
        if size <= ENUMERATE_UP_TO:
            pool = [
                {**proposal, **dict(zip(names, combo))}
                for combo in itertools.product(*(space[n].choices for n in names))
            ]  # type: ignore[attr-defined]
        else:
            pool = [
                {**proposal, **{n: space[n].choices[int(self.rng.integers(len(space[n].choices)))] for n in names}}  # type: ignore[attr-defined]
                for _ in range(FAR_DRAWS)
            ]
        fresh = [c for c in pool if not _repeats(c, tried)]
        if not fresh:
            return None
        self.rng.shuffle(fresh)  # type: ignore[arg-type]
        return min(fresh, key=lambda c: sum(c[n] != proposal[n] for n in names))

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()
        self.rng = np.random.default_rng()


def _space_of_running(study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
    """The knobs every other running trial has suggested with the same distribution (their intersection)."""
    space: dict[str, BaseDistribution] | None = None
    for other in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if other.number != trial.number:
            space = (
                dict(other.distributions)
                if space is None
                else {n: d for n, d in space.items() if other.distributions.get(n) == d}
            )
    return {n: d for n, d in (space or {}).items() if not d.single()}


def _repeats(params: Mapping[str, Any], tried: list[dict[str, Any]]) -> bool:
    """Whether `params` gives a route already tried: it agrees with one on every knob that one had.

    Knobs a tried route lacks were inactive there, and stay inactive with the same parent values.
    """
    return any(all(params.get(k) == v for k, v in t.items()) for t in tried)


def _neighbours(params: Mapping[str, Any], space: Mapping[str, BaseDistribution]) -> list[dict[str, Any]]:
    return [
        {**params, name: c}
        for name, d in space.items()
        if name in params
        for c in getattr(d, "choices", ())
        if c != params[name]
    ]
