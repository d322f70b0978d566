"""Every use of Optuna's private or unstable surface, in one place (written for Optuna 5.0, RDB schema v3.2.0.a).

An Optuna upgrade touches this module only; `tests/test_structure.py` pins the version and schema it
was written for and exercises each function against a real storage. What is used and why:

- `Study._storage`, `Study._study_id`, `Trial._trial_id` (FrozenTrial too): the worker works on
  trials by id through the storage (leases, reaping, re-queueing) with no public accessor for them;
- the legacy `constraints` system attribute, which optuna-dashboard 0.21 reads instead of the
  per-key constraints of `Trial.set_constraint`;
- Optuna's RDB models (`optuna.storages._rdb.models`) and the per-key constraint attribute name
  (`constraints:<key>`), to write a finished trial's attributes, constraints and intermediate
  values and its final state in one transaction of a few statements, fenced by its lease
  (`settle_trial`): the public API spends one transaction (two statements) per attribute and a read
  per constraint, and `Study.tell` could not check the lease in the transaction that finishes the trial;
- optuna-dashboard's note layout (`optuna_dashboard._note`: a version attribute and the body in chunks of
  study system attributes), to write the study note in one transaction (`save_study_note`): its
  `save_note` spends two reads of every study attribute and a transaction per chunk;
- `Study._thread_local.cached_all_trials`, cleared after such a write as `Study.tell` clears it;
- trial counts read with SQL on Optuna's `trials` and `trial_user_attributes` tables, because the
  cached storage of a long-lived process is not fresh across processes (the budget must be exact).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import datetime
from types import ModuleType
from typing import Any

import optuna
from optuna.storages import BaseStorage, RDBStorage
from optuna.storages._rdb import models
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import or_, select, text
from sqlalchemy.dialects import postgresql, sqlite

from tuner.errors import TunerError, first_line
from tuner.store.db import engine_kwargs, get_engine
from tuner.store.leases import Fence
from tuner.store.urls import mask_url, scrub
from tuner.study import attrs as A

WRITTEN_FOR = "5.0"  # Optuna major.minor these functions were checked against
SCHEMA = "v3.2.0.a"  # Optuna's RDB schema (alembic) version the SQL below reads


def open_storage(
    url: str, kind: type[RDBStorage] = RDBStorage, create_tables: bool = True, migration: bool = False
) -> RDBStorage:
    """Optuna's RDB storage (or a subclass `kind`) on `url` with our engine options; a one-line TunerError if unusable.

    With `create_tables=False` nothing is created in the database (read-only commands); `migration`: for
    `upgrade()`, its statements and transactions without a time limit (`tuner.store.db.MIGRATION_UNBOUNDED`).
    """
    try:
        return kind(url, engine_kwargs=engine_kwargs(url, migration), skip_table_creation=not create_tables)
    except Exception as exc:  # Optuna wraps schema and connection problems in several types
        raise TunerError(f"storage {mask_url(url)}: {first_line(scrub(str(exc), url))}") from exc


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage a study reads and writes."""
    return study._storage


def study_id(study: optuna.Study) -> int:
    """The study's id in its storage."""
    return study._study_id


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """A trial's id in its storage (not its number)."""
    return trial._trial_id


def trial_by_number(study: optuna.Study, number: int) -> FrozenTrial:
    """A fresh read of the study's trial `number`."""
    storage = storage_of(study)
    return storage.get_trial(storage.get_trial_id_from_study_id_trial_number(study_id(study), number))


def constraint_attrs(constraints: Mapping[str, float]) -> dict[str, Any]:
    """The system attributes of `constraints`: per key as `Trial.set_constraint` writes them, and the legacy
    `constraints` list (in the same order) that optuna-dashboard 0.21 reads."""
    return {
        **{f"constraints:{k}": float(v) for k, v in constraints.items()},
        "constraints": [float(v) for v in constraints.values()],
    }


UPSERTS = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}


def settle_trial(
    study: optuna.Study,
    trial: optuna.Trial | FrozenTrial,
    state: TrialState,
    value: float | None,
    user_attrs: Mapping[str, Any],
    constraints: Mapping[str, float] | None = None,
    intermediate: Mapping[int, float] | None = None,
    fence: Fence | None = None,
) -> bool:
    """Finish a running trial: its attributes, constraints, intermediate values and state, in one transaction.

    On PostgreSQL and SQLite the lease `fence` is held first (`LeaseLost` if the trial was reaped or
    re-leased meanwhile, and nothing is written), then the trial row is locked and checked to be
    running, then one multi-row upsert per table and the state. A trial already finished under this
    fence (an earlier attempt committed, its reply lost) is left as it is: False. As `Study.tell`
    does, a PRUNED trial takes its last intermediate value and a COMPLETE one whose value is not a
    finite number is FAIL; the sampler's `after_trial` runs once the state is stored. Elsewhere:
    Optuna's public calls, one per item, unfenced.
    """
    storage = storage_of(study)
    rdb = getattr(storage, "_backend", storage)  # the RDB storage behind Optuna's cache
    tid = trial_id(trial)
    system = constraint_attrs(constraints) if constraints else {}
    intermediate = dict(intermediate or {})
    state, values = _final(state, value, {**storage.get_trial(tid).intermediate_values, **intermediate})
    upsert = UPSERTS.get(rdb.engine.name) if isinstance(rdb, RDBStorage) else None
    if upsert is None:
        for key, v in user_attrs.items():
            storage.set_trial_user_attr(tid, key, v)
        for key, v in system.items():
            storage.set_trial_system_attr(tid, key, v)
        for step, v in intermediate.items():
            storage.set_trial_intermediate_value(tid, step, v)
        storage.set_trial_state_values(tid, state, values)
    elif not _settle_rows(rdb, upsert, tid, state, values, user_attrs, system, intermediate, fence):
        return False
    study._thread_local.cached_all_trials = None
    study.sampler.after_trial(study, storage.get_trial(tid), state, values)
    return True


def _final(
    state: TrialState, value: float | None, intermediate: Mapping[int, float]
) -> tuple[TrialState, list[float] | None]:
    """The state and values `Study.tell` would store."""
    if state == TrialState.COMPLETE:
        return (state, [float(value)]) if value is not None and math.isfinite(value) else (TrialState.FAIL, None)
    if state == TrialState.PRUNED and intermediate:
        last = intermediate[max(intermediate)]
        return state, [float(last)] if math.isfinite(last) else None
    return state, None


def _settle_rows(
    rdb: RDBStorage,
    upsert: Any,
    tid: int,
    state: TrialState,
    values: list[float] | None,
    user_attrs: Mapping[str, Any],
    system: Mapping[str, Any],
    intermediate: Mapping[int, float],
    fence: Fence | None,
) -> bool:
    trials = models.TrialModel.__table__
    with rdb.engine.begin() as conn:
        if fence is not None:
            fence.hold(conn, settle=True)
        now = conn.execute(select(trials.c.state).where(trials.c.trial_id == tid).with_for_update()).scalar_one()
        now = TrialState[now] if isinstance(now, str) else now
        if fence is not None and now.is_finished():
            return False  # settled under this very fence by an attempt whose reply was lost
        rdb.check_trial_is_updatable(tid, now)
        for model, rows in ((models.TrialUserAttributeModel, user_attrs), (models.TrialSystemAttributeModel, system)):
            if rows:
                _upsert(
                    conn,
                    upsert,
                    model,
                    [{"trial_id": tid, "key": k, "value_json": json.dumps(v)} for k, v in rows.items()],
                    ["trial_id", "key"],
                )
        if intermediate:
            table = models.TrialIntermediateValueModel
            rows = [
                dict(
                    zip(("intermediate_value", "intermediate_value_type"), table.intermediate_value_to_stored_repr(v)),
                    trial_id=tid,
                    step=step,
                )
                for step, v in intermediate.items()
            ]
            _upsert(conn, upsert, table, rows, ["trial_id", "step"])
        if values:
            table = models.TrialValueModel
            rows = [
                dict(zip(("value", "value_type"), table.value_to_stored_repr(v)), trial_id=tid, objective=i)
                for i, v in enumerate(values)
            ]
            _upsert(conn, upsert, table, rows, ["trial_id", "objective"])
        conn.execute(
            trials.update().where(trials.c.trial_id == tid).values(state=state, datetime_complete=datetime.now())
        )
    return True


def save_study_note(study: optuna.Study, body: str, notes: ModuleType) -> None:
    """Write the study's optuna-dashboard note `body` as `notes.save_note` would (`notes`: `optuna_dashboard._note`).

    On PostgreSQL and SQLite in one transaction: the note's attributes are read (locked on PostgreSQL,
    so two writers number their versions in turn), then the next version, the body's chunks and
    blanks for chunks left over from a longer note are upserted. Elsewhere: `notes.save_note`.
    """
    storage = storage_of(study)
    rdb = getattr(storage, "_backend", storage)
    upsert = UPSERTS.get(rdb.engine.name) if isinstance(rdb, RDBStorage) else None
    if upsert is None:
        notes.save_note(study, body)
        return
    table = models.StudySystemAttributeModel.__table__
    version_key, prefix = notes.note_ver_key(None), notes.note_str_key_prefix(None)
    chunks = notes.split_body(body, None)
    sid = study_id(study)
    with rdb.engine.begin() as conn:
        old = dict(
            conn.execute(
                select(table.c.key, table.c.value_json)
                .where(
                    table.c.study_id == sid,
                    or_(table.c.key == version_key, table.c.key.startswith(prefix, autoescape=True)),
                )
                .with_for_update()
            ).all()
        )
        version = int(json.loads(old[version_key])) + 1 if version_key in old else 1
        left_over = {key: "" for key in old if key.startswith(prefix) and key not in chunks}
        values = {version_key: version, **chunks, **left_over}
        rows = [{"study_id": sid, "key": k, "value_json": json.dumps(v)} for k, v in values.items()]
        _upsert(conn, upsert, models.StudySystemAttributeModel, rows, ["study_id", "key"])


def _upsert(conn: Any, upsert: Any, model: Any, rows: list[dict[str, Any]], keys: list[str]) -> None:
    """One multi-row INSERT ... ON CONFLICT (keys) DO UPDATE of `model`'s other columns."""
    stmt = upsert(model.__table__).values(rows)
    changed = {c: stmt.excluded[c] for c in rows[0] if c not in keys}
    conn.execute(stmt.on_conflict_do_update(index_elements=keys, set_=changed))


def count_by_state(url: str, study: int, key: str) -> dict[tuple[str, Any], int]:
    """Trials of study id `study` per (state name, their user attribute `key`, None where unset), read fresh.

    State names are COMPLETE, PRUNED, FAIL, RUNNING, WAITING. One query: the budget counts trials by
    state and some of them by failure class under the study lock before every `ask`.
    """
    sql = (
        "SELECT t.state, a.value_json, COUNT(*) FROM trials t LEFT JOIN trial_user_attributes a "
        "ON a.trial_id = t.trial_id AND a.key = :key WHERE t.study_id = :s GROUP BY t.state, a.value_json"
    )
    with get_engine(url).connect() as conn:
        rows = conn.execute(text(sql), {"s": study, "key": key}).all()
    return {
        (str(state).split(".")[-1].upper(), None if value is None else json.loads(value)): int(n)
        for state, value, n in rows
    }


def enqueue_retry(study: optuna.Study, params: dict[str, Any], user_attrs: dict[str, Any]) -> bool:
    """Enqueue `params` as the retry of the trial its `user_attrs` name (`retry_of`), unless one exists; False if it
    did.

    The check and the insert are one transaction (the study row locked, as Optuna locks it to number a
    trial), and it is not retried inside: Optuna's own `create_new_trial` repeats its insert after a
    connection that broke once the COMMIT was sent, which would enqueue the route twice.
    """
    from optuna.storages._rdb.storage import _create_scoped_session

    storage = storage_of(study)
    backend: RDBStorage = getattr(storage, "_backend", storage)  # under Optuna's cache layer, if any
    template = optuna.trial.create_trial(
        state=TrialState.WAITING, system_attrs={"fixed_params": params}, user_attrs=user_attrs
    )
    with _create_scoped_session(backend.scoped_session) as session:
        models.StudyModel.find_or_raise_by_id(study_id(study), session, for_update=True)
        exists = session.execute(
            select(models.TrialUserAttributeModel.trial_user_attribute_id)
            .join(models.TrialModel, models.TrialModel.trial_id == models.TrialUserAttributeModel.trial_id)
            .where(
                models.TrialModel.study_id == study_id(study),
                models.TrialUserAttributeModel.key == A.RETRY_OF,
                models.TrialUserAttributeModel.value_json == json.dumps(user_attrs[A.RETRY_OF]),
            )
            .limit(1)
        ).first()
        if exists is not None:
            return False
        backend._get_prepared_new_trial(study_id(study), template, session)
    return True
