"""Recording a trial costs a few statements, however many attributes it has (tuner.study.outcome, optuna_adapter).

Counted on the real PostgreSQL with SQLAlchemy's cursor events; no timing involved.
"""

from __future__ import annotations

from typing import Any

import optuna
from sqlalchemy import event

from tuner import job as J
from tuner.store.urls import normalize_url
from tuner.study import optuna_adapter as oa
from tuner.study import outcome


def _result() -> J.Result:
    return J.Result(
        status=J.OK,
        latency={"median": 2.0, "mean": 2.1},
        accuracy=0.0,
        accuracy_per_output={"y": 0.0},
        phase_s={"build": 0.1, "time": 0.2},
        build_s=0.1,
        artifact_sha256="ab" * 32,
        artifact_bytes=10,
        paired={
            "paired": True,
            "speedup": 1.25,
            "ci": [1.2, 1.3],
            "confidence": 0.95,
            "stop": "precision",
            "running": [[c, 1.2 + c / 100, 1.1, 1.4] for c in range(5, 40)],
        },
    )


def _statements(study: optuna.Study, extra: dict[str, Any]) -> tuple[int, optuna.trial.FrozenTrial]:
    """Statements that recording one trial (with `extra` attributes) sends to the database, and the trial as stored."""
    trial = study.ask()
    engine = oa.storage_of(study)._backend.engine  # type: ignore[attr-defined]
    sent: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        attrs = outcome.user_attrs(_result(), "cosine", 0.01, extra)
        outcome.record(study, trial, _result(), 0.01, "median", attrs, baseline_value=4.0)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    return len(sent), oa.trial_by_number(study, trial.number)


def test_a_trial_is_recorded_in_the_same_few_statements_whatever_its_attributes(pg_url: str) -> None:
    study = optuna.create_study(study_name="writes", storage=oa.open_storage(normalize_url(pg_url)))
    few, first = _statements(study, {"worker": "w0"})
    many, second = _statements(study, {"worker": "w0", **{f"extra_{i}": i for i in range(40)}})
    assert few == many  # on main: two statements more per attribute
    for t in (first, second):
        assert t.state == optuna.trial.TrialState.COMPLETE and t.value == 4.0 / 1.25
        assert (
            t.system_attrs["constraints:accuracy"] == t.system_attrs["constraints:failure"] == -1.0
        )  # as Trial.set_constraint
        assert t.system_attrs["constraints"] == [-1.0, -1.0] and outcome.is_feasible(
            t
        )  # the legacy list the dashboard reads
        assert t.user_attrs["feasible"] is True and t.user_attrs["speedup_paired"] == 1.25
        assert 1 < len(t.intermediate_values) <= outcome.MAX_REPORTS and t.intermediate_values[39] == 4.0 / (
            1.2 + 39 / 100
        )
    assert second.user_attrs["extra_39"] == 39
