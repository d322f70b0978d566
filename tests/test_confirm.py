"""Winner confirmation: the interval statistics, the stored-artifact reuse, and a real study with nothing to find."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna_dashboard import get_note

from tests.conftest import SpecWriter
from tuner import job as J
from tuner.measure.speedup import (
    Speedup,
    min_rounds,
    mixed_cycles,
    signed_rank_counts,
    speedup_from_log_ratios,
    speedup_interval,
)
from tuner.spec import load_spec
from tuner.store.cache import ResultStore
from tuner.store.urls import normalize_url
from tuner.study import attrs as A
from tuner.study import verdict as V
from tuner.study.racing import Standing
from tuner.study.reuse import WRAPPER, reuse_env
from tuner.study.setup import Context
from tuner.worker import confirm as C
from tuner.worker.isolate import run_isolated
from tuner.worker.jobs import make_job

SAME_ENGINE = "tests.backends:SameEngineBackend"
SKEWED = "tests.backends:SkewedBackend"


def test_signed_rank_null_distribution_is_exact() -> None:
    counts = signed_rank_counts(8)
    assert sum(counts) == 2**8 and len(counts) == 8 * 9 // 2 + 1
    assert counts == counts[::-1]  # symmetric
    assert sum(counts[:4]) == 5  # P(T <= 3) = 5/256: the tabulated two-sided 5% critical value for n = 8
    assert min_rounds(0.95) == 6 and min_rounds(0.99) == 8


def test_interval_finds_a_real_speedup_and_contains_it() -> None:
    rng = np.random.default_rng(1)
    default = 10.0 * np.exp(rng.normal(0, 0.03, 8))
    candidate = default / 1.2 * np.exp(rng.normal(0, 0.03, 8))
    s = speedup_interval(default, candidate, 0.95)
    assert s.significant and s.low <= 1.2 <= s.high
    assert s.confidence >= 0.95 and s.rounds == 8


def test_interval_rarely_invents_a_win_from_noise() -> None:
    """Same distribution for both routes, 400 seeded studies: wins stay within the one-sided error rate."""
    rng = np.random.default_rng(2)
    wins = 0
    for _ in range(400):
        default, candidate = np.exp(rng.normal(0, 0.1, (2, 8)))
        wins += speedup_interval(default, candidate, 0.95).significant
    assert wins / 400 <= 0.04  # exact one-sided rate is 5/256 < 2%


def test_the_intervals_pay_for_the_candidates_and_the_looks() -> None:
    assert C.looks(8) == 8 - C.MIN_ROUNDS + 1
    assert C.interval_level(0.95, 3, 8) == pytest.approx(1 - 0.05 / (3 * C.looks(8)))
    assert C.interval_level(0.95, 1, C.MIN_ROUNDS) == pytest.approx(
        0.95
    )  # one candidate, one look: the level asked for


def _trial(number: int, noop: str, value: float, accuracy: float = -1.0) -> optuna.trial.FrozenTrial:
    """A finished trial with the tuner's two constraints (feasible unless `accuracy` > 0)."""
    t = optuna.trial.create_trial(
        params={"noop": noop},
        distributions={"noop": CategoricalDistribution(["a", "b", "c", "d"])},
        value=value,
        constraints={"accuracy": accuracy, "failure": -1.0},
    )
    t.number = number
    return t


def _paired(rng: np.random.Generator, speedup: float, contended: bool = False, spread: float = 0.03) -> J.Result:
    """One process's paired result: per-cycle log ratios around log(`speedup`), offset by a process-wide draw."""
    d = list(rng.normal(np.log(speedup) + rng.normal(0, spread / 3), spread, 12))
    s = speedup_from_log_ratios(d, 0.95)
    return J.Result(
        status=J.OK,
        latency={"median": 4.0 / speedup},
        paired={
            "paired": True,
            "log_ratios": d,
            "speedup": s.estimate,
            "ci": [s.low, s.high],
            "cycles": len(d),
            "contended": contended,
            "baseline_latency": {"median": 4.0},
        },
    )


def _run(
    factors: dict[int, float],
    cap: int = 8,
    contended_rounds: tuple[int, ...] = (),
    spread: float = 0.03,
    seed: int = 3,
    extend: bool = True,
) -> tuple[dict, list[C.RoundEvent]]:
    rng = np.random.default_rng(seed)
    candidates = [C.Candidate(_trial(n, "abc"[n - 1], 4.0)) for n in factors]
    events: list[C.RoundEvent] = []
    level = C.interval_level(0.95, len(candidates), cap)
    stopped = C.run_rounds(
        candidates,
        lambda t, r: _paired(rng, factors[t.number], r in contended_rounds, spread),
        cap,
        level,
        "median",
        events.append,
        extend,
    )
    return C.judge(candidates, level, 0.95, cap, stopped, "median"), events


@pytest.mark.parametrize(
    ("factor", "verdict"), [(1.25, V.SPEEDUP), (0.8, V.DEFAULT_IS_FASTEST), (1.0, V.NO_SIGNIFICANT)]
)
def test_judge_declares_a_win_only_when_the_interval_clears_one(factor: float, verdict: str) -> None:
    doc, events = _run({1: factor, 2: min(factor, 1.0)})
    assert doc["verdict"] == verdict, doc["message"]
    assert (doc["winner_trial"] == 1) == (verdict == V.SPEEDUP)
    assert len(doc["candidates"]) == 2 and all("low" in c and "high" in c for c in doc["candidates"])
    assert doc["default_median_ms"] == 4.0 and all(
        c["median_ms"] == pytest.approx(4.0 / f) for c, f in zip(doc["candidates"], (factor, min(factor, 1.0)))
    )
    assert len(events) == 2 * doc["rounds"] and events[-1].standings.keys() == {1, 2}
    assert not any("shapes" in c for c in doc["candidates"]) and "per shape" not in doc["message"]  # one shape


SHAPES = ({"x": [1, 3, 16, 16]}, {"x": [8, 3, 16, 16]})


def _shaped(rng: np.random.Generator, factors: tuple[float, float]) -> J.Result:
    """One process of a two-shape study: each shape's paired figures and the mixed cycles (weights 0.7, 0.3)."""
    per_shape = [_paired(rng, f) for f in factors]
    mixed = mixed_cycles([r.paired["log_ratios"] for r in per_shape], [0.7, 0.3])
    s = speedup_from_log_ratios(mixed, 0.95)
    res = _paired(rng, 1.0)
    res.latency = {"median": 4.0 / s.estimate}
    res.paired.update(log_ratios=mixed, speedup=s.estimate, ci=[s.low, s.high])
    res.paired["shapes"] = [
        {
            "inputs": inputs,
            "weight": weight,
            "route_ms": r.latency["median"],
            "default_ms": 4.0,
            "speedup": r.paired["speedup"],
            "ci": r.paired["ci"],
            "log_ratios": r.paired["log_ratios"],
        }
        for inputs, weight, r in zip(SHAPES, (0.7, 0.3), per_shape)
    ]
    return res


def test_each_shape_is_pooled_over_the_processes_at_the_candidates_level() -> None:
    rng = np.random.default_rng(6)
    candidate = C.Candidate(_trial(1, "b", 4.0))
    level = C.interval_level(0.95, 1, 4)
    stopped = C.run_rounds([candidate], lambda t, r: _shaped(rng, (1.5, 0.9)), 4, level, "median", lambda e: None)
    doc = C.judge([candidate], level, 0.95, 4, stopped, "median")
    (row,) = doc["candidates"]
    fast, slow = row["shapes"]
    assert [(s["inputs"], s["weight"]) for s in row["shapes"]] == [(SHAPES[0], 0.7), (SHAPES[1], 0.3)]
    assert fast["ci"][0] > 1.0 and slow["ci"][1] < 1.0  # each shape's own interval, not the mix's
    assert fast["confidence"] == slow["confidence"] == row["confidence"]  # pooled alike, at the same level
    assert fast["route_ms"] == pytest.approx(4.0 / 1.5, rel=0.1) and fast["default_ms"] == slow["default_ms"] == 4.0
    assert "; per shape: x 1x3x16x16 " in doc["message"] and ", x 8x3x16x16 0." in doc["message"], doc["message"]


def test_the_confirmation_stops_as_soon_as_the_verdict_is_decided() -> None:
    doc, events = _run({1: 2.0, 2: 0.9, 3: 0.8})  # a clear winner: decided after the fewest rounds
    assert doc["verdict"] == V.SPEEDUP and doc["winner_trial"] == 1 and doc["stopped"] == "decided"
    assert doc["rounds"] == C.MIN_ROUNDS and len(events) == 3 * C.MIN_ROUNDS
    assert [e.decided for e in events[:-1]] == [""] * (len(events) - 1) and "trial 1 is faster" in events[-1].decided
    assert "decided: trial 1" in events[-1].text()
    doc, events = _run({1: 1.0, 2: 1.0})  # nothing to find: the cap
    assert doc["stopped"] == "cap" and doc["rounds"] == 8 and not any(e.decided for e in events)


def test_candidates_that_cannot_be_told_apart_but_all_win_decide_the_verdict() -> None:
    """Two routes equally fast and both clearly faster than the default: the verdict cannot change, so stop."""
    doc, events = _run({1: 2.0, 2: 2.0})
    assert doc["verdict"] == V.SPEEDUP and doc["stopped"] == "decided" and doc["rounds"] == C.MIN_ROUNDS
    assert "trials 1 and 2 are each faster than the default route and cannot be told apart" in events[-1].decided
    other = 2 if doc["winner_trial"] == 1 else 1
    assert f"as fast within the measurement, and also confirmed: trial {other} " in doc["message"], doc["message"]
    doc, events = _run({1: 2.0, 2: 1.9})  # both win, 5 % apart: no tie, however close their intervals
    assert not any("cannot be told apart" in e.decided for e in events)
    doc, events = _run({1: 2.0, 2: 1.01})  # one clear leader, the other not a win: no tie, decided by separation
    assert doc["winner_trial"] == 1 and "also confirmed" not in doc["message"]


def test_of_wins_it_cannot_tell_apart_the_confirmation_names_the_one_the_study_also_measured_faster() -> None:
    """Two wins whose processes cannot order them: the study's own measurements (racing's standings) break the tie;
    the speedup and interval reported stay the confirmation's, and wins told apart keep their order."""
    rng = np.random.default_rng(11)
    candidates = [C.Candidate(_trial(n, "ab"[n - 1], 4.0)) for n in (1, 2)]
    level = C.interval_level(0.95, 2, 8)
    stopped = C.run_rounds(
        candidates, lambda t, r: _paired(rng, 2.0, spread=0.3), 8, level, "median", lambda e: None
    )  # one engine twice, processes far apart: a tie in either order
    alone = C.judge(candidates, level, 0.95, 8, stopped, "median")
    fastest = alone["trial"]
    other = 3 - fastest
    assert alone["verdict"] == V.SPEEDUP and "named before" not in alone["message"]
    own = {
        fastest: Standing(fastest, 2.0, 1.96, 2.04, 2),
        other: Standing(other, 2.3, 2.25, 2.35, 2),
    }  # the study measured the other one faster, tightly
    doc = C.judge(candidates, level, 0.95, 8, stopped, "median", own)
    assert doc["trial"] == doc["winner_trial"] == other, doc["message"]
    assert f"named before trial {fastest} (" in doc["message"], doc["message"]
    row = next(c for c in doc["candidates"] if c["trial"] == other)
    assert doc["speedup"] == row["speedup"] and doc["ci"] == [row["low"], row["high"]]  # the confirmation's figures
    vague = {other: Standing(other, 2.3, 1e-3, 1e3, 0)}  # a study figure too wide to say anything: no change
    assert C.judge(candidates, level, 0.95, 8, stopped, "median", vague)["trial"] == fastest

    rng = np.random.default_rng(12)
    apart = [C.Candidate(_trial(n, "ab"[n - 1], 4.0)) for n in (1, 2)]
    stopped = C.run_rounds(
        apart, lambda t, r: _paired(rng, {1: 2.0, 2: 1.5}[t.number]), 8, level, "median", lambda e: None
    )
    told = {1: Standing(1, 1.5, 1.49, 1.51, 2), 2: Standing(2, 2.5, 2.49, 2.51, 2)}
    assert C.judge(apart, level, 0.95, 8, stopped, "median", told)["trial"] == 1  # told apart: the study's say is moot


def test_a_win_the_cap_could_not_tell_from_its_rivals_is_decided_early() -> None:
    """Three wins 3 % apart whose processes differ by far more: the cap's rounds could only confirm the leader's win,
    which is confirmed already, so the rounds stop; with processes that agree, the same routes are measured on."""
    doc, events = _run({1: 2.3, 2: 2.24, 3: 2.23}, spread=0.36)
    assert doc["verdict"] == V.SPEEDUP and doc["stopped"] == "decided" and doc["rounds"] < 8
    assert "are each faster than the default route; 8 rounds could not tell them apart" in events[-1].decided
    doc, events = _run({1: 2.0, 2: 1.9}, spread=0.03)  # 5 % apart, processes that agree: measured until told apart
    assert doc["winner_trial"] == 1 and "and than every other candidate" in events[-1].decided


def test_a_rival_the_cap_could_not_tell_from_the_winner_is_not_called_a_win_unless_it_is_one() -> None:
    """The leader's win is confirmed and the rounds left could not tell a close rival from it; the rival's own
    interval still reaches below 1.01, so only the leader is said to be faster than the default route."""
    leader, rival = Speedup(1.066, 1.027, 1.106, 0.99, 36), Speedup(1.064, 0.987, 1.148, 0.99, 36)
    said = C.decided({1: leader, 4: rival}, {1: 12, 4: 8}, 16)
    assert said == "trial 1 is faster than the default route; 16 rounds could not tell it from trial 4 here"
    both = C.decided({1: leader, 4: Speedup(1.064, 1.02, 1.11, 0.99, 36)}, {1: 12, 4: 8}, 16)
    assert both.startswith("trials 1 and 4 are each faster than the default route")


def test_the_interval_at_the_cap_shrinks_with_the_processes_and_the_t_quantile() -> None:
    s = Speedup(2.0, 1.6, 2.5, 0.99, 36)
    assert C.halfwidth_at_cap(s, 8, 8) == pytest.approx(math.log(2.5 / 1.6) / 2)  # at the cap already: as it is
    assert C.halfwidth_at_cap(s, 3, 8) < C.halfwidth_at_cap(s, 5, 8) < C.halfwidth_at_cap(s, 8, 8)
    assert C.unbreakable(s, 3, Speedup(1.9, 1.5, 2.4, 0.99, 36), 3, 8)
    assert not C.unbreakable(s, 3, Speedup(1.2, 1.1, 1.3, 0.99, 36), 3, 8)


def test_a_process_times_no_finer_than_the_decision_needs() -> None:
    assert C.process_target(0.02, 1.03, []) == 0.02  # a near tie: the study's own precision
    assert C.process_target(0.02, 1.5, []) == pytest.approx(C.DISTANCE_SHARE * math.log(1.5 / C.MIN_SPEEDUP))
    assert C.process_target(0.02, 3.0, []) == C.PROCESS_TARGET_MAX  # never looser than this
    assert C.process_target(0.02, 3.0, [math.log(1.03)]) == 0.02  # its processes so far, not the study, decide
    apart = [math.log(1.05), math.log(1.18)]  # processes 12 % apart: their spread, not their distance, decides
    assert C.process_target(0.02, None, apart) == pytest.approx(C.SPREAD_SHARE * np.std(apart, ddof=1))
    assert C.process_target(0.1, 1.5, apart) == 0.1  # never finer than the study asks


def test_a_candidate_that_can_no_longer_be_the_answer_is_not_measured_again() -> None:
    """Candidate 3 is clearly slower after MIN_ROUNDS; the undecided pair goes on without it."""
    doc, events = _run({1: 1.0, 2: 1.0, 3: 0.5})
    rows = {row["trial"]: row for row in doc["candidates"]}
    assert rows[3]["processes"] == C.MIN_ROUNDS < rows[2]["processes"], rows
    assert sum(e.trial == 3 for e in events) == C.MIN_ROUNDS


def test_the_extension_looks_share_the_error_of_the_look_it_replaces() -> None:
    assert C.look_rounds(8) == (3, 4, 5, 6, 8) and C.look_rounds(8, extended=True) == (3, 4, 5, 6, 8, 12, 16)
    assert C.look_rounds(4) == (3, 4) and not C.extendable(4)  # nothing to trade: every round looked at, no extension
    assert C.look_rounds(8, extend=False) == (3, 4, 5, 6, 7, 8)
    level = C.interval_level(0.95, 3, 8)
    base, longer = C.look_rounds(8), C.look_rounds(8, extended=True)
    error = len(base) * (1 - level) + (len(longer) - len(base)) * (1 - C.extension_level(level))
    assert error == pytest.approx(0.05 / 3)  # per candidate: the family still holds at 95 %


def test_a_near_tie_with_the_default_is_measured_on_until_it_is_resolved() -> None:
    """A route 2 % faster than the default: eight processes leave its interval above 1.0 but not clear of
    MIN_SPEEDUP; the extension's processes confirm it. Without the extension the same processes end at the cap."""
    doc, events = _run({1: 1.02, 2: 0.9}, spread=0.02)
    assert doc["verdict"] == V.SPEEDUP and doc["winner_trial"] == 1 and doc["extended"]
    rows = {row["trial"]: row for row in doc["candidates"]}
    assert 8 < rows[1]["processes"] <= 2 * 8 and rows[2]["processes"] < 8  # the slower one was not measured on
    assert doc["interval_level"] == pytest.approx(C.extension_level(C.interval_level(0.95, 2, 8)))
    assert "measured on to 16 rounds" in doc["method"] and events[-1].cap == 16
    doc, _ = _run({1: 1.02, 2: 0.9}, spread=0.02, extend=False)
    assert doc["verdict"] == V.NO_SIGNIFICANT and doc["stopped"] == "cap" and not doc["extended"]
    assert 1.0 < doc["ci"][0] < C.MIN_SPEEDUP  # what made it a near tie


def test_a_near_tie_the_extension_could_not_make_a_win_ends_at_the_cap() -> None:
    """A route 0.8 % faster: its interval lies above 1.0 at the cap, but at its estimate twice the processes could
    not lift it clear of MIN_SPEEDUP, so none are run."""
    doc, events = _run({1: 1.008}, spread=0.006)
    assert doc["candidates"][0]["low"] > 1.0 and doc["stopped"] == "cap"
    assert not doc["extended"] and doc["rounds"] == 8 and events[-1].cap == 8


@pytest.mark.parametrize("seed", range(6))
def test_the_extension_never_makes_a_win_of_equal_engines(seed: int) -> None:
    doc, _ = _run({1: 1.0, 2: 1.0, 3: 1.0}, seed=seed)
    assert doc["verdict"] != V.SPEEDUP and doc["winner_trial"] is None


def test_a_win_must_clear_the_least_speedup_worth_reporting() -> None:
    """A consistent 0.5 % edge is significant (its interval excludes 1.0) but no win: it never reaches MIN_SPEEDUP."""
    doc, events = _run({1: 1.005}, spread=0.001)
    (row,) = doc["candidates"]
    assert 1.0 < row["low"] < C.MIN_SPEEDUP and row["high"] < C.MIN_SPEEDUP
    assert doc["verdict"] == V.NO_SIGNIFICANT and doc["winner_trial"] is None
    assert f"not clear of the {C.MIN_SPEEDUP}x a win needs" in doc["message"]
    assert doc["stopped"] == "decided" and doc["rounds"] == C.MIN_ROUNDS  # none can become a win: stop early
    assert f"no candidate can be {C.MIN_SPEEDUP}x faster" in events[-1].decided
    doc, _ = _run({1: 1.05}, spread=0.001)
    assert doc["verdict"] == V.SPEEDUP and doc["candidates"][0]["low"] > C.MIN_SPEEDUP


def test_contended_processes_are_run_again_and_decide_nothing() -> None:
    doc, events = _run({1: 2.0}, contended_rounds=(0, 1))
    assert [e.contended for e in events[:2]] == [True, True] and "contended, not counted" in events[0].text()
    assert events[1].standings == {}  # two contended processes: nothing to stand on
    (row,) = doc["candidates"]
    assert row["contended"] == 2 and row["processes"] == C.MIN_ROUNDS and doc["verdict"] == V.SPEEDUP
    doc, events = _run(
        {1: 2.0, 2: 1.0}, contended_rounds=tuple(range(C.MIN_ROUNDS))
    )  # a host busy throughout: stop, say so
    assert doc["stopped"] == "busy" and len(events) == 2 * C.MIN_ROUNDS and doc["verdict"] == C.NOTHING_TO_CONFIRM
    assert (
        "the host was busy throughout" in doc["message"]
        and doc["contention"]["contended_processes"] == 2 * C.MIN_ROUNDS
    )
    doc, events = _run({1: 2.0, 2: 1.0}, contended_rounds=(0, 1, 3, 4))  # most rounds contended
    assert doc["stopped"] == "busy" and "the host was busy" in doc["message"]
    assert len(events) < 2 * (8 + C.CONTENDED_EXTRA)  # stopped before the cap and its extra rounds


def test_candidates_are_feasible_distinct_and_not_the_default_route() -> None:
    trials = [
        _trial(n, noop, value, acc)
        for n, noop, value, acc in (
            (0, "a", 5.0, -1.0),
            (1, "b", 4.0, -1.0),
            (2, "b", 4.5, -1.0),
            (3, "a", 3.0, -1.0),
            (4, "c", 2.0, 0.5),
            (5, "c", 4.8, -1.0),
        )
    ]
    assert [t.number for t in C.pick_candidates(trials, trials[0], 3)] == [1, 5]
    assert [t.number for t in C.pick_candidates(trials, trials[0], 1)] == [1]
    raced = {"5": {"value_refined": 3.5}, "1": {"value_refined": 4.2}}  # racing pooled them: trial 5 is the faster
    assert [t.number for t in C.pick_candidates(trials, trials[0], 1, raced)] == [5]


def test_reuse_runs_the_stored_artifact_and_rebuilds_when_it_is_gone(write_spec: SpecWriter, tmp_path: Path) -> None:
    ctx = Context(load_spec(write_spec(**{"backend.name": SAME_ENGINE})), f"sqlite:///{tmp_path / 'x.db'}")
    route = ctx.space.default_route()
    first = run_isolated(make_job(ctx, route, tmp_path / "a" / "out"), tmp_path / "a")
    assert first.status == J.OK and first.build_s and first.build_s > 0
    stored = Path(first.artifact_path or "")
    job = make_job(ctx, route, tmp_path / "b" / "out")
    job.backend = WRAPPER
    again = run_isolated(job, tmp_path / "b", env=reuse_env(SAME_ENGINE, stored, first.artifact_sha256))
    assert again.status == J.OK, again.message
    assert again.build_s == 0.0 and again.artifact_path == str(stored) and "reusing stored artifact" in again.log
    stored.write_bytes(b"tampered")
    job.out_dir = str(tmp_path / "c" / "out")
    rebuilt = run_isolated(job, tmp_path / "c", env=reuse_env(SAME_ENGINE, stored, first.artifact_sha256))
    assert rebuilt.status == J.OK and rebuilt.build_s and rebuilt.build_s > 0
    assert rebuilt.artifact_path != str(stored) and "rebuilding" in rebuilt.log


def test_a_swapped_process_times_the_engine_loaded_as_the_baseline_as_the_candidate(
    write_spec: SpecWriter, tmp_path: Path
) -> None:
    ctx = Context(load_spec(write_spec(**{"backend.name": SKEWED})), f"sqlite:///{tmp_path / 'x.db'}")
    default = ctx.space.default_route()  # fp32: every call of its engine is slowed by 5 ms
    fast = dict(default, precision="fp16")
    built = run_isolated(make_job(ctx, fast, tmp_path / "fast" / "out"), tmp_path / "fast")
    assert built.status == J.OK, built.message
    engine = {"trial": 1, "path": built.artifact_path, "sha256": built.artifact_sha256, "route": fast}
    job = make_job(ctx, default, tmp_path / "swap" / "out", baseline=engine, swapped=True)
    res = run_isolated(job, tmp_path / "swap")
    assert res.status == J.OK, res.message  # the default's engine was the one gated and checked
    assert res.paired["swapped"] is True and res.paired["speedup"] > 10  # the fast engine, timed as the candidate
    assert res.latency["median"] < 1.0 < res.paired["baseline_latency"]["median"]


@pytest.mark.slow
def test_a_study_with_nothing_to_find_reports_no_win(cli, write_spec: SpecWriter, pg_url: str) -> None:
    spec = write_spec(**{"backend.name": SAME_ENGINE, "run.budget": 5, "run.startup_trials": 5})
    url = normalize_url(pg_url)
    run = cli("run", str(spec), "--storage", pg_url, "--confirm-top-k", "1", "--confirm-confidence", "0.99")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "confirmation: " in run.stdout and "x faster than the default" not in run.stdout, run.stdout

    study = optuna.load_study(study_name="tiny", storage=url)
    doc = study.user_attrs["confirmation"]
    assert doc["verdict"] in (V.NO_SIGNIFICANT, V.DEFAULT_IS_FASTEST), doc
    cap = C.EXTEND * 8 if doc["extended"] else 8  # a pooled offset above 1.0 (a near tie) is measured on past the cap
    assert doc["winner_trial"] is None and C.MIN_ROUNDS <= doc["rounds"] <= cap and doc["baseline_trial"] == 0
    assert doc["candidate_trials"] == [doc["candidates"][0]["trial"]] and doc["settings"]["confidence"] == 0.99
    (cand,) = doc["candidates"]
    assert cand["trial"] != 0 and cand["route"]["noop"] != "a"
    # not a win; a pooled offset of a few tenths of a percent may exclude 1.0 (why a win must clear MIN_SPEEDUP)
    assert cand["low"] <= cand["speedup"] <= cand["high"] and not cand["low"] > C.MIN_SPEEDUP

    confirm_runs = ResultStore(url).measurements("tiny", kind="confirm")
    rounds = doc["rounds"] + cand["contended"]
    assert len(confirm_runs) == 2 * rounds and {m.trial_number for m in confirm_runs} == {
        0,
        cand["trial"],
    }  # both engines of each process
    assert sorted(m.stats["round"] for m in confirm_runs) == sorted(list(range(rounds)) * 2)
    swaps = [m.stats["paired"].get("swapped", False) for m in confirm_runs if m.trial_number == cand["trial"]]
    assert sum(swaps) == rounds // 2 or cand["contended"], swaps  # every other process the engines trade places
    assert len({m.result_key for m in confirm_runs}) == 1 and all(len(m.samples_ms) >= 5 for m in confirm_runs)

    best = cli("best", str(spec), "--storage", pg_url)
    assert best.returncode == 0, best.stderr
    assert "confirmation: " in best.stdout and "CI" in best.stdout
    assert ("no significant speedup" in best.stdout) or ("already the fastest" in best.stdout)
    assert best.stdout.startswith("Keep the default route"), best.stdout  # one conclusion, first
    head = json.loads(cli("best", str(spec), "--storage", pg_url, "--json").stdout)
    assert head["confirmation"]["verdict"] == doc["verdict"] == head["verdict"]
    assert (head["trial"], head["speedup"], head["speedup_ci"]) == (cand["trial"], doc["speedup"], doc["ci"])
    assert head["export_trial"] == 0 and head["study_speedup"] is not None
    out = spec.parent / "export"
    exported = cli("best", str(spec), "--storage", pg_url, "--export", str(out))
    assert exported.returncode == 0 and "the default route, trial 0" in exported.stderr, exported.stderr
    assert json.loads((out / "route.json").read_text()) == study.trials[0].params
    named = spec.parent / "export-candidate"  # a route the confirmation measured: its README gives those figures
    written = cli("best", str(spec), "--storage", pg_url, "--export", str(named), "--trial", str(cand["trial"]))
    assert written.returncode == 0, written.stderr
    assert (
        f"in the confirmation: {cand['median_ms']:.4g} ms, the default route {cand['default_median_ms']:.4g} ms "
        f"(medians of its {cand['processes']} paired processes)"
    ) in (named / "README.md").read_text()

    assert doc["message"] in get_note(optuna.load_study(study_name="tiny", storage=url))

    too_few = cli("run", str(spec), "--storage", pg_url, "--confirm-rounds", "2")
    assert too_few.returncode == 2 and "--confirm-rounds 2 is too few" in too_few.stderr


def test_a_route_that_fails_on_re_measurement_is_reported_not_judged() -> None:
    broken = C.Candidate(_trial(1, "b", 4.0), failure="accuracy: cosine=0.2 > 0.001 on 4 feeds")
    doc = C.judge([broken], 0.95, 0.95, 8, "cap", "median")
    assert doc["verdict"] == C.NOTHING_TO_CONFIRM and "every candidate failed" in doc["message"]
    assert doc["candidates"][0]["failure"].startswith("accuracy:")
    rng = np.random.default_rng(4)
    failing = C.Candidate(_trial(2, "c", 4.0))
    C.run_rounds(
        [failing],
        lambda t, r: J.Result(status=J.CRASH_SIGNAL, message="child died of SIGSEGV"),
        8,
        0.95,
        "median",
        lambda e: None,
    )
    assert failing.failure == "crash-signal: child died of SIGSEGV" and not failing.log_ratios
    unpaired = C.Candidate(_trial(3, "a", 4.0))
    result = _paired(rng, 1.0)
    result.paired = {"paired": False, "unpaired": "the baseline engine did not load: ValueError"}
    C.run_rounds([unpaired], lambda t, r: result, 8, 0.95, "median", lambda e: None)
    assert "the baseline engine did not load" in unpaired.failure


def test_a_stored_confirmation_says_what_it_confirmed_and_whether_it_still_holds(
    write_spec: SpecWriter, sqlite_url: str
) -> None:
    ctx = Context(load_spec(write_spec(**{"backend.name": SAME_ENGINE})), sqlite_url)
    study = optuna.create_study(study_name=ctx.spec.study, storage=sqlite_url)
    for number, noop, value in ((0, "a", 4.0), (1, "b", 3.0), (2, "c", 3.5)):
        t = _trial(number, noop, value)
        t.set_user_attr("source", "baseline" if number == 0 else "sampler")
        study.add_trial(t)
    rng = np.random.default_rng(5)
    doc = C.judge_study(
        study, "median", lambda t, r: _paired(rng, 1.3 if t.number == 1 else 1.0), top_k=2, log=lambda line: None
    )
    study.set_user_attr(A.CONFIRMATION, {**doc, "settings": C.settings(ctx, 2, 0.95, C.DEFAULT_ROUNDS)})
    assert doc["candidate_trials"] == [1, 2] and doc["baseline_trial"] == 0 and doc["verdict"] == V.SPEEDUP
    assert C.is_current(ctx, study, top_k=2)
    assert not C.is_current(ctx, study, top_k=1) and not C.is_current(
        ctx, study, top_k=2, confidence=0.99
    )  # other settings
    study.add_trial(_trial(3, "a", 2.0))  # the default's route again: not a candidate, nothing changes
    assert C.is_current(ctx, study, top_k=2)
    t = _trial(4, "d", 2.0)
    study.add_trial(t)  # a new best since: the stored confirmation no longer holds
    assert not C.is_current(ctx, study, top_k=2)
