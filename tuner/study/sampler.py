"""Sampler construction: a distinct seed per worker and per restart, constraint-aware by default."""

from __future__ import annotations

import os

import optuna

from tuner.spec import RunSpec


def make_sampler(run: RunSpec, worker_index: int) -> optuna.samplers.BaseSampler:
    """The study's sampler for one worker process.

    Seeds mix the study seed, the worker index and the process id, so workers and restarts never
    replay one another's proposals (a fixed seed re-proposes the first configurations after a restart).
    """
    seed = (run.seed * 1_000_003 + worker_index * 7919 + os.getpid()) % (2**31)
    if run.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if run.sampler == "gp":
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=run.startup_trials)
    return optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=run.startup_trials, multivariate=True, group=True, constant_liar=True
    )
