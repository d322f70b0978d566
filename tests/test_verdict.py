"""Verdict selection (`tuner.study.verdict`): one conclusion from the confirmation, else from the study."""

from __future__ import annotations

from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from tuner.study import verdict as V
from tuner.study.summary import summarize_study

DIST = {"noop": CategoricalDistribution(["a", "b", "c", "d"])}


def _study(*trials: tuple[str, float, float], paired: dict[int, dict[str, Any]] | None = None) -> optuna.Study:
    """An in-memory study: trial 0 is the baseline; each (route, value, accuracy constraint) is a finished trial."""
    study = optuna.create_study()
    for n, (noop, value, accuracy) in enumerate(trials):
        attrs: dict[str, Any] = {"source": "baseline"} if n == 0 else {}
        attrs.update((paired or {}).get(n, {}))
        study.add_trial(
            optuna.trial.create_trial(
                params={"noop": noop},
                distributions=DIST,
                value=value,
                user_attrs=attrs,
                constraints={"accuracy": accuracy, "failure": -1.0},
            )
        )
    return study


def _decide(study: optuna.Study, confirmation: dict[str, Any] | None = None) -> V.Headline:
    return V.decide(summarize_study(study), confirmation, study.get_trials(deepcopy=False))


def _confirmation(
    verdict: str, trial: int, speedup: float, ci: list[float], winner: int | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "verdict": verdict,
        "trial": trial,
        "winner_trial": winner,
        "speedup": speedup,
        "ci": ci,
        "confidence": 0.95,
        "rounds": 8,
        "study_best_trial": extra.pop("study_best_trial", trial),
        "candidates": [{"trial": trial}],
        "message": "m",
        **extra,
    }


THREE = (("a", 10.0, -1.0), ("b", 8.0, -1.0), ("c", 5.0, 0.5))  # trial 2 is fastest but breaks the tolerance


def test_without_a_confirmation_the_study_estimate_is_unconfirmed_and_nothing_is_exported() -> None:
    head = _decide(_study(*THREE))
    assert head.verdict == V.UNCONFIRMED and head.trial is not None and head.trial.number == 1
    assert head.estimate == head.study == V.Estimate(1.25)  # baseline value / best feasible value, no interval
    assert head.export_trial is None and head.baseline_trial == 0
    doc = head.to_json()
    assert (
        doc["verdict"] == "unconfirmed" and doc["speedup"] == doc["study_speedup"] == 1.25 and doc["speedup_ci"] is None
    )
    assert "Not confirmed" in head.sentence and "unpaired" in head.sentence and "trial 1" in head.sentence


def test_the_paired_trial_measurement_is_the_study_estimate_where_it_exists() -> None:
    study = _study(*THREE, paired={1: {"paired": True, "speedup_paired": 1.1, "speedup_paired_ci": [1.05, 1.16]}})
    head = _decide(study)
    assert head.verdict == V.UNCONFIRMED and head.study == V.Estimate(1.1, 1.05, 1.16, paired=True)
    assert head.to_json()["speedup_ci"] == [1.05, 1.16] and "CI 1.05x-1.16x" in head.sentence
    study.set_user_attr("racing", {"1": {"speedup_refined": 1.08, "speedup_refined_ci": [1.06, 1.1], "remeasured": 1}})
    _, raced = V.study_headline(study)  # racing re-measured it: the pooled estimate is the study's
    assert raced.study == V.Estimate(1.08, 1.06, 1.1, paired=True) and raced.verdict == V.UNCONFIRMED


def test_before_the_confirmation_racing_s_confirmed_best_leads() -> None:
    paired = {
        n: {"paired": True, "speedup_paired": s, "speedup_paired_ci": [s - 0.1, s + 0.1]}
        for n, s in ((1, 1.3), (3, 1.2))
    }
    study = _study(
        *THREE, ("d", 9.0, -1.0), paired=paired
    )  # trial 1 is the study's best by value; 3 was re-measured and confirmed
    study.set_user_attr("racing", {"3": {"speedup_refined": 1.25, "speedup_refined_ci": [1.2, 1.3], "remeasured": 1}})
    _, head = V.study_headline(study)
    assert (
        head.verdict == V.UNCONFIRMED
        and head.trial is not None
        and head.trial.number == 3
        and head.export_trial is None
    )
    assert head.study == V.Estimate(1.25, 1.2, 1.3, paired=True)


@pytest.mark.parametrize(
    ("stored", "verdict", "factor", "ci", "exports"),
    [
        ("speedup", V.SPEEDUP, 1.3, [1.2, 1.4], 1),
        ("no-significant-speedup", V.NO_SIGNIFICANT, 1.02, [0.95, 1.1], 0),
        ("default-is-fastest", V.DEFAULT_IS_FASTEST, 0.8, [0.7, 0.9], 0),
        ("default-fastest", V.DEFAULT_IS_FASTEST, 0.8, [0.7, 0.9], 0),  # stored by earlier versions
    ],
)
def test_a_confirmation_decides_and_exports_the_winner_or_the_default(
    stored: str, verdict: str, factor: float, ci: list[float], exports: int
) -> None:
    study = _study(*THREE)
    head = _decide(study, _confirmation(stored, 1, factor, ci, winner=1 if stored == "speedup" else None))
    assert head.verdict == verdict and head.trial is not None and head.trial.number == 1
    assert head.estimate == V.Estimate(factor, ci[0], ci[1], paired=True) and head.study == V.Estimate(1.25)
    assert head.export_trial == exports
    doc = head.to_json()
    assert (doc["speedup"], doc["speedup_ci"], doc["study_speedup"]) == (factor, ci, 1.25)
    assert head.sentence.startswith("Use trial 1" if verdict == V.SPEEDUP else "Keep the default route")
    assert f"{factor:.2f}x" in head.sentence and "95% CI" in head.sentence


def test_a_confirmation_that_could_not_judge_leaves_the_study_unconfirmed() -> None:
    conf = {
        "verdict": "nothing-to-confirm",
        "rounds": 8,
        "candidates": [{"trial": 1, "failure": "crash-signal"}],
        "message": "nothing to confirm: on re-measurement every candidate failed",
        "study_best_trial": 1,
    }
    head = _decide(_study(*THREE), conf)
    assert head.verdict == V.UNCONFIRMED and head.export_trial is None and "every candidate failed" in head.sentence


def test_a_study_where_only_the_default_is_feasible_keeps_the_default() -> None:
    study = _study(("a", 10.0, -1.0), ("b", 5.0, 0.5))
    conf = {
        "verdict": "nothing-to-confirm",
        "rounds": 0,
        "candidates": [],
        "message": "nothing to confirm: no feasible route",
    }
    head = _decide(study, conf)
    assert (
        head.verdict == V.DEFAULT_IS_FASTEST
        and head.export_trial == 0
        and head.estimate == V.Estimate(1.0, 1.0, 1.0, paired=True)
    )
    assert _decide(study).verdict == V.UNCONFIRMED  # before the confirmation ran, nothing is decided


def test_a_confirmation_made_before_a_faster_trial_still_decides_and_says_it_is_stale() -> None:
    study = _study(*THREE, ("d", 6.0, -1.0))  # trial 3, found after the confirmation, looks fastest
    head = _decide(study, _confirmation("speedup", 1, 1.3, [1.2, 1.4], winner=1, study_best_trial=1))
    assert head.verdict == V.SPEEDUP and head.export_trial == 1
    assert "Trial 3, found since, is not confirmed" in head.sentence


def test_without_a_feasible_default_no_speedup_is_stated() -> None:
    head = _decide(_study(("a", 10.0, 0.5), ("b", 8.0, -1.0)))
    assert head.verdict == V.UNCONFIRMED and head.estimate is None and head.to_json()["speedup"] is None
    assert "no speedup can be stated" in head.sentence


def _shape(batch: int, speedup: float, ci: list[float]) -> dict[str, Any]:
    return {"inputs": {"x": [batch, 3, 16, 16]}, "weight": 0.5, "speedup": speedup, "ci": ci}


def test_with_several_shapes_the_sentence_says_each_shape_s_speedup_from_what_it_stands_on() -> None:
    measured = [_shape(1, 1.3, [1.2, 1.4]), _shape(8, 0.9, [0.8, 1.0])]
    paired = {1: {"paired": True, "speedup_paired": 1.1, "speedup_paired_ci": [1.0, 1.2], "shapes": measured}}
    study = _study(*THREE, paired=paired)
    head = _decide(study)  # unconfirmed: the trial's own figures
    assert head.sentence.endswith(" Per shape: x 1x3x16x16 1.30x [1.20-1.40], x 8x3x16x16 0.90x [0.80-1.00].")
    assert head.shapes == tuple(measured)
    confirmed = [_shape(1, 1.25, [1.22, 1.28]), _shape(8, 0.95, [0.9, 0.99])]
    conf = _confirmation("speedup", 1, 1.15, [1.1, 1.2], winner=1, candidates=[{"trial": 1, "shapes": confirmed}])
    head = _decide(study, conf)  # confirmed: the confirmation's figures, not the study's
    assert "Per shape: x 1x3x16x16 1.25x [1.22-1.28], x 8x3x16x16 0.95x [0.90-0.99]." in head.sentence
    assert head.shapes == tuple(confirmed) and "1.30x" not in head.sentence
    one = _study(*THREE, paired={1: {**paired[1], "shapes": measured[:1]}})
    assert "Per shape" not in _decide(one).sentence  # one shape: the speedup is that shape's


def test_a_trial_racing_re_measured_is_said_with_racing_s_per_shape_figures_until_a_confirmation_has_its_own() -> None:
    measured = [_shape(1, 1.3, [1.2, 1.4]), _shape(8, 0.9, [0.8, 1.0])]
    paired = {1: {"paired": True, "speedup_paired": 1.1, "speedup_paired_ci": [1.0, 1.2], "shapes": measured}}
    study = _study(*THREE, paired=paired)
    pooled = [_shape(1, 1.2, [1.15, 1.25]), _shape(8, 1.01, [1.0, 1.02])]
    racing = {
        "1": {"speedup_refined": 1.12, "speedup_refined_ci": [1.1, 1.14], "remeasured": 1, "shapes_refined": pooled}
    }
    study.set_user_attr("racing", racing)
    _, head = V.study_headline(study)  # racing-confirmed, not confirmed at the end
    assert head.verdict == V.UNCONFIRMED and head.shapes == tuple(pooled) and head.shapes_from == V.FROM_RACING
    assert head.sentence.endswith(
        " Per shape, racing's re-measurements pooled: x 1x3x16x16 1.20x [1.15-1.25], x 8x3x16x16 1.01x [1.00-1.02]."
    )
    conf = _confirmation("speedup", 1, 1.15, [1.1, 1.2], winner=1)  # a confirmation row without per-shape figures
    head = V.decide(summarize_study(study), conf, study.get_trials(deepcopy=False), racing)
    assert head.verdict == V.SPEEDUP and head.shapes == tuple(pooled) and head.shapes_from == V.FROM_RACING
    confirmed = [_shape(1, 1.25, [1.22, 1.28]), _shape(8, 0.95, [0.9, 0.99])]
    conf["candidates"] = [{"trial": 1, "shapes": confirmed}]
    head = V.decide(summarize_study(study), conf, study.get_trials(deepcopy=False), racing)
    assert head.shapes == tuple(confirmed) and head.shapes_from == V.FROM_CONFIRMATION and "racing" not in head.sentence
