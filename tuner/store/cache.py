"""The content-addressed build cache and what goes with it: environments, measurements, artifacts."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from tuner.store.db import get_engine, retried
from tuner.store.leases import Fence
from tuner.store.models import ArtifactRecord, CachedResult, Environment, Measurement


def digest(obj: Any) -> str:
    """sha256 of the canonical JSON of `obj`."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def cache_key(
    *,
    model_sha: str,
    shapes: dict[str, Any],
    data_sha: str,
    backend: str,
    backend_version: str,
    environment_id: str,
    route: dict[str, Any],
    options: dict[str, Any],
    measure: dict[str, Any],
) -> str:
    """Everything that can change a trial's result, hashed: nothing is reused across a changed key."""
    return digest(
        {
            "model": model_sha,
            "shapes": shapes,
            "data": data_sha,
            "backend": backend,
            "version": backend_version,
            "env": environment_id,
            "route": route,
            "options": options,
            "measure": measure,
        }
    )


def new_run_id() -> str:
    """A fresh id for one timing run's measurement row (chosen once, outside the retried insert)."""
    return uuid.uuid4().hex


def _upsert_ignore(session: Session, model: type, values: dict[str, Any]) -> None:
    """INSERT ... ON CONFLICT DO NOTHING, on PostgreSQL and SQLite alike."""
    dialect = session.get_bind().dialect.name
    stmt = (pg_insert if dialect == "postgresql" else sqlite_insert)(model).values(**values).on_conflict_do_nothing()
    session.execute(stmt)


def measurement_row(
    run_id: str,
    study: str,
    trial_number: int,
    result_key: str,
    kind: str,
    stats: dict[str, Any],
    samples_ms: list[float],
    timing_info: dict[str, Any],
) -> dict[str, Any]:
    """A timing run's row of raw samples (`run_id`: `new_run_id()`, chosen before any retry, keeps it unique)."""
    return {
        "run_id": run_id,
        "study": study,
        "trial_number": trial_number,
        "result_key": result_key,
        "kind": kind,
        "stats": stats,
        "samples_ms": samples_ms,
        "timing_info": timing_info,
        "created_at": time.time(),
    }


class ResultStore:
    """Read and write the tuner's own tables for one storage URL."""

    def __init__(self, url: str) -> None:
        self.engine = get_engine(url)

    @retried
    def record_environment(self, data: dict[str, Any]) -> str:
        """Store a fingerprint (idempotent) and return its id."""
        env_id = digest(data)[:32]
        with Session(self.engine) as s, s.begin():
            _upsert_ignore(s, Environment, {"id": env_id, "data": data, "created_at": time.time()})
        return env_id

    @retried
    def lookup(self, key: str) -> CachedResult | None:
        """The stored result for a cache key, if any."""
        with Session(self.engine) as s:
            row = s.get(CachedResult, key)
            if row is not None:
                s.expunge(row)
            return row

    @retried
    def save(
        self, key: str, fence: Fence | None = None, measurement: dict[str, Any] | None = None, **values: Any
    ) -> None:
        """Store a result under `key` unless another worker stored one first; only while `fence` holds.

        `measurement` (`measurement_row`): the timing run behind the result, kept in the same transaction.
        """
        with Session(self.engine) as s, s.begin():
            if fence is not None:
                fence.hold(s.connection())
            _upsert_ignore(s, CachedResult, {"key": key, "created_at": time.time(), **values})
            if measurement is not None:
                _upsert_ignore(s, Measurement, measurement)

    @retried
    def add_measurement(self, row: dict[str, Any]) -> None:
        """Keep a timing run's raw samples (`measurement_row`), once: its `run_id`, chosen before retries, is unique."""
        with Session(self.engine) as s, s.begin():
            _upsert_ignore(s, Measurement, row)

    @retried
    def measurements(self, study: str, kind: str | None = None) -> list[Measurement]:
        """A study's measurements (optionally of one kind), oldest first."""
        with Session(self.engine) as s:
            q = select(Measurement).where(Measurement.study == study)
            if kind:
                q = q.where(Measurement.kind == kind)
            rows = list(s.scalars(q.order_by(Measurement.id)))
            s.expunge_all()
            return rows

    @retried
    def add_artifact(self, sha256: str, path: str, size: int, backend: str) -> None:
        """Record a kept artifact file (idempotent)."""
        with Session(self.engine) as s, s.begin():
            _upsert_ignore(
                s,
                ArtifactRecord,
                {"sha256": sha256, "path": path, "bytes": size, "backend": backend, "created_at": time.time()},
            )

    @retried
    def artifact(self, sha256: str) -> ArtifactRecord | None:
        """The record of a kept artifact."""
        with Session(self.engine) as s:
            row = s.get(ArtifactRecord, sha256)
            if row is not None:
                s.expunge(row)
            return row
