"""One declaration per objective setting: the loader, the job, the cache key and the resume fingerprint all follow
it."""

from __future__ import annotations

from typing import Any

import pytest

from tuner import job as J
from tuner.objective import ObjectiveSpec, Setting, settings, value_type
from tuner.spec import load_spec
from tuner.study.fingerprint import completed, differences
from tuner.study.setup import Context
from tuner.worker.jobs import make_job, measure_settings


def _another(name: str, default: Any, s: Setting) -> Any:
    """A valid value of setting `name` other than its default (and other than the test study's value)."""
    if s.choices:
        return next(c for c in s.choices if c != default)
    if name == "cores":
        return 1  # every machine has one
    if value_type(name) is tuple:  # shapes: the tiny model's own (its graph fixes them), weighted
        return [{"inputs": {"x": [1, 3, 16, 16]}, "weight": 2.0}]
    if value_type(name) is int:
        return (default or 1) + 3
    value = 0.37 if default is None else default * 1.5 + 0.01
    return min(value, (s.below or 2.0) * 0.9)


def _facts(spec_path: Any) -> tuple[dict[str, Any], dict[str, Any], ObjectiveSpec]:
    spec = load_spec(spec_path)
    ctx = Context(spec, "sqlite://")
    return ctx.fingerprint(), measure_settings(spec), spec.objective


@pytest.mark.parametrize("name", [name for name, _, _ in settings()])
def test_changing_any_objective_setting_changes_the_fingerprint_and_the_cache_key(write_spec, name: str) -> None:
    default, declared = next((d, s) for n, d, s in settings() if n == name)
    base_fp, base_key, base = _facts(write_spec("base.toml"))
    value = _another(name, getattr(base, name) if getattr(base, name) is not None else default, declared)
    fp, key, objective = _facts(write_spec("changed.toml", **{f"objective.{name}": value}))
    assert ObjectiveSpec.from_plain(objective.plain()) == objective  # a job's JSON round trip
    value = objective.plain()[name] if value_type(name) is tuple else value
    assert objective.plain()[name] == value  # the loader read it
    space = ["search space differs in inter_op_threads, intra_op_threads"] if name == "cores" else []  # fewer threads
    assert (fp != base_fp) == declared.fingerprint and differences(base_fp, fp) == (
        [f"objective.{name}: study has {base.plain()[name]!r}, file has {value!r}", *space]
        if declared.fingerprint
        else []
    )
    assert (key != base_key) == declared.key
    assert declared.fingerprint  # every setting changes what a study's results mean
    assert (
        declared.key or name == "max_memory_mb"
    )  # ... and all but the memory cap (a judgement of what was measured) what is measured


def test_the_job_carries_every_setting_through_its_json(write_spec, tmp_path) -> None:
    changed = {f"objective.{n}": _another(n, d, s) for n, d, s in settings()}
    spec = load_spec(write_spec(**changed))
    job = make_job(Context(spec, "sqlite://"), {}, tmp_path / "out")
    job.write(tmp_path / "job.json")
    assert J.Job.read(tmp_path / "job.json").objective == spec.objective
    assert all(spec.objective.plain()[k.partition(".")[2]] == v for k, v in changed.items())


def test_a_late_setting_at_its_default_leaves_stored_cache_keys_as_they_were() -> None:
    o = ObjectiveSpec(
        warmup_s=0.0, min_repeats=5, min_duration_s=0.02, target_halfwidth=0.1, timing_cap_s=0.3, block_s=0.002
    )
    from tuner.objective import cache_part

    assert cache_part(o) == [0.0, 5, 0.02, "per-call", 0.1, 0.3, 0.002]  # the key's form before the declaration
    assert cache_part(ObjectiveSpec(statistic="mean"))[-1] == {"statistic": "mean"}


def test_a_fingerprint_stored_before_the_declaration_is_read_and_completed(write_spec) -> None:
    current, _, _ = _facts(write_spec())
    legacy = {k: v for k, v in current.items() if k != "objective"}
    legacy["objective"] = "median"
    legacy["timing"] = {k: current["objective"][k] for k in ("warmup_s", "min_repeats", "min_duration_s")}
    assert differences(legacy, current) == []
    assert completed(legacy, current) == current
    legacy["timing"]["min_repeats"] = 99
    assert differences(legacy, current) == [
        f"objective.min_repeats: study has 99, file has {current['objective']['min_repeats']}"
    ]
    partial = {**current, "objective": {k: v for k, v in current["objective"].items() if k != "block_s"}}
    assert (
        differences(partial, {**current, "objective": {**current["objective"], "block_s": 9.0}}) == []
    )  # unknown: accepted
    assert completed(partial, current) == current
