"""Unit tests of the pure pieces: search spaces, accuracy metrics, latency statistics, URL masking."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner import job as J
from tuner.measure.accuracy import Tolerances, compare, worst
from tuner.measure.timing import TimingPolicy, measure, summarize
from tuner.space import Param, SearchSpace, canonical_route
from tuner.store.urls import mask_url, normalize_url, scrub
from tuner.study.outcome import accuracy_violation, judge

SPACE = SearchSpace(
    (
        Param("precision", ("fp32", "int8"), "fp32"),
        Param("per_channel", (True, False), True, when=lambda r: r["precision"] == "int8"),
        Param("threads", (0, 1, 2), 0),
    )
)


def test_default_route_and_conditions() -> None:
    assert SPACE.default_route() == {"precision": "fp32", "threads": 0}
    routes = SPACE.routes()
    assert len(routes) == 3 + 2 * 3  # per_channel only exists for int8
    assert {"precision": "int8", "per_channel": False, "threads": 2} in routes


def test_restrict_keeps_defaults_and_rejects_unknowns() -> None:
    small = SPACE.restrict({"threads": [0, 2]})
    assert small.param("threads").choices == (0, 2)
    assert small.fingerprint() != SPACE.fingerprint()
    with pytest.raises(KeyError):
        SPACE.restrict({"unroll": [1]})
    with pytest.raises(ValueError, match="default"):
        SPACE.restrict({"threads": [1]})
    with pytest.raises(ValueError, match="not among"):
        SPACE.restrict({"threads": [0, 7]})
    with pytest.raises(ValueError):
        SPACE.restrict({"per_channel": [True, 1]})  # 1 is not the boolean True


def test_canonical_route_is_order_independent() -> None:
    assert canonical_route({"b": 1, "a": True}) == canonical_route({"a": True, "b": 1})


def test_metrics() -> None:
    ref = [{"y": np.array([[1.0, 2.0, 3.0]])}, {"y": np.array([[3.0, 2.0, 1.0]])}]
    got = [{"y": np.array([[1.0, 2.0, 3.5]])}, {"y": np.array([[1.0, 2.0, 3.0]])}]
    tol = Tolerances(atol=0.1, rtol=0.0)
    assert compare("max_abs", got, ref, tol)["y"] == 2.0
    assert compare("mean_abs", got, ref, tol)["y"] == pytest.approx((0.5 + 2 + 0 + 2) / 6)
    assert compare("top1_mismatch", got, ref, tol)["y"] == 0.5
    assert compare("outside_tol", got, ref, tol)["y"] == pytest.approx(3 / 6)
    assert compare("cosine", ref, ref, tol)["y"] == pytest.approx(0.0, abs=1e-12)
    assert compare("cosine", got, ref, tol)["y"] == pytest.approx(1 - 10 / 14)
    assert compare("rms", got, ref, tol)["y"] == pytest.approx(math.sqrt((0.25 + 4 + 4) / 6))


def test_wrong_or_missing_outputs_are_infinitely_bad() -> None:
    ref = [{"y": np.ones((1, 3)), "z": np.ones((1, 2))}]
    got = [{"y": np.full((1, 3), np.nan)}]
    per = compare("max_abs", got, ref, Tolerances())
    assert per == {"y": math.inf, "z": math.inf} and worst(per) == math.inf


def test_timing_respects_count_and_duration() -> None:
    calls = []

    def once() -> float:
        calls.append(1)
        return 0.001

    samples = measure(once, TimingPolicy(warmup_s=0.0, min_repeats=7, min_duration_s=0.0))
    assert len(samples) == 7 and len(calls) == 8  # one warm-up
    stats = summarize([1.0, 2.0, 3.0, 4.0])
    assert (
        stats.median == 2.5
        and stats.min == 1.0
        and stats.count == 4
        and stats.cv == pytest.approx(np.std([1, 2, 3, 4]) / 2.5)
    )


def test_outcome_encoding() -> None:
    ok = J.Result(status=J.OK, latency={"median": 2.0}, accuracy=0.005)
    j = judge(ok, tolerance=0.01, statistic="median")
    assert j.state.name == "COMPLETE" and j.value == 2.0 and j.feasible and j.constraints == (-0.5, -1.0)
    bad = judge(J.Result(status=J.ACCURACY, latency={"median": 1.0}, accuracy=0.03), 0.01, "median")
    assert bad.state.name == "COMPLETE" and not bad.feasible and bad.constraints[0] == pytest.approx(2.0)
    crash = judge(J.Result(status=J.CRASH_SIGNAL), 0.01, "median")
    assert crash.state.name == "PRUNED" and crash.constraints == (0.0, 1.0)
    gate = judge(J.Result(status=J.GATE_FAILED, accuracy=0.5), 0.01, "median")
    assert gate.state.name == "PRUNED" and gate.constraints[0] > 0
    assert judge(J.Result(status=J.LOST), 0.01, "median").state.name == "FAIL"
    assert accuracy_violation(math.inf, 0.1) > 0 and accuracy_violation(0.0, 0.0) == 0.0


def test_urls_are_masked_and_pinned_to_psycopg2() -> None:
    url = "postgresql://alice:hunter2@db:5432/t"
    assert "hunter2" not in mask_url(url) and "alice:***@db" in mask_url(url)
    assert scrub(f"failed for {url} (password hunter2)", url).count("hunter2") == 0
    assert normalize_url(url).startswith("postgresql+psycopg2://")
    assert normalize_url("sqlite:///x.db") == "sqlite:///x.db"
