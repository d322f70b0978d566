"""The default sampler never proposes a route already tried while an untried one exists."""

from __future__ import annotations

import os
import subprocess
import sys

import optuna
import pytest

from tuner.spec import RunSpec
from tuner.study.sampler import sampler_for

CHOICES = {
    "mode": ("default", "reduce-overhead"),
    "precision": ("fp32", "tf32", "bf16", "fp16"),
    "channels_last": (False, True),
    "freezing": (False, True),
    "fusion": (True, False),
}  # 64 routes


def _route(trial: optuna.Trial) -> tuple:
    return tuple(trial.suggest_categorical(name, choices) for name, choices in CHOICES.items())


@pytest.mark.parametrize("in_flight", [1, 8])
def test_every_route_once_before_any_repeat(in_flight: int) -> None:
    """64 asks over a 64-route space give 64 distinct routes, with up to 8 trials running at once, for 20 seeds.

    The landscape of the GPU study (the objective: a fixed value per route) has a clear best region,
    which is where TPE keeps proposing once its neighbours within two knobs are all tried. With 8 in
    flight, the first 8 asks come before any trial has finished (seeds 1, 2 and 5 repeated one there).
    """
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    for seed in range(20):
        assert len(set(_routes_of_one_study(seed, in_flight))) == 64, f"seed {seed}"


def _routes_of_one_study(seed: int, in_flight: int) -> list[tuple]:
    study = optuna.create_study(sampler=sampler_for(RunSpec(budget=64, sampler="tpe"), seed))
    seen: list[tuple] = []
    running: list[tuple[optuna.Trial, tuple]] = []
    for _ in range(64):
        trial = study.ask()
        route = _route(trial)
        seen.append(route)
        running.append((trial, route))
        if len(running) >= in_flight:
            done, r = running.pop(0)
            study.tell(done, float(CHOICES["precision"].index(r[1]) + 2 * r[0].count("r") + r[2]))
    return seen


GP_THREADS = """
import os

import torch
from tuner.spec import RunSpec
from tuner.study.sampler import sampler_for
sampler_for(RunSpec(budget=1, sampler="gp"), 0)
print(os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads())
"""


@pytest.mark.parametrize("given", [None, "2"])
def test_the_gp_sampler_limits_its_own_threads_not_the_environment_trial_children_inherit(given: str | None) -> None:
    """One thread for the GP's fits in the worker, set in torch; OMP_NUM_THREADS, which every trial child would
    inherit (and which would replace the child server), is left as the user set it or did not."""
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if given is not None:
        env["OMP_NUM_THREADS"] = given
    out = subprocess.run([sys.executable, "-c", GP_THREADS], env=env, capture_output=True, text=True, check=True)
    variable, threads = out.stdout.split()
    assert variable == str(given)
    assert int(threads) == (1 if given is None else int(given))
