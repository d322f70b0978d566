"""SQLAlchemy 2.0 models of the tuner's own tables (all prefixed `tuner_`; Optuna's are untouched).

Rows refer to Optuna trials by (study name, trial number) or Optuna's trial_id, without foreign keys,
so Optuna can upgrade its own schema independently.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Float, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    """Declarative base of the tuner's tables."""


class Environment(Base):
    """A device/software fingerprint (CPU or GPU, driver, runtime and backend versions)."""

    __tablename__ = "tuner_environments"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float)


class CachedResult(Base):
    """The outcome of building and measuring one route under one cache key (content-addressed)."""

    __tablename__ = "tuner_results"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    backend: Mapped[str] = mapped_column(String(64))
    backend_version: Mapped[str] = mapped_column(String(64))
    environment_id: Mapped[str] = mapped_column(String(64))
    route: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(32))
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    accuracy: Mapped[float | None] = mapped_column(Float, nullable=True)
    result: Mapped[dict[str, Any]] = mapped_column(JSON)
    artifact_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    study: Mapped[str] = mapped_column(String(128))
    trial_number: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)


class Measurement(Base):
    """Raw latency samples of one timing run, with the statistics and timing facts."""

    __tablename__ = "tuner_measurements"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    study: Mapped[str] = mapped_column(String(128), index=True)
    trial_number: Mapped[int] = mapped_column(Integer)
    result_key: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(32))  # trial | confirm
    stats: Mapped[dict[str, Any]] = mapped_column(JSON)
    samples_ms: Mapped[list[float]] = mapped_column(JSON)
    timing_info: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float)
    # One id per timing run, chosen before it is stored: a retried insert of the same run adds nothing.
    run_id: Mapped[str | None] = mapped_column(String(64), nullable=True, unique=True)


class ArtifactRecord(Base):
    """An engine/artifact file kept by content hash."""

    __tablename__ = "tuner_artifacts"
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    path: Mapped[str] = mapped_column(Text)
    bytes: Mapped[int] = mapped_column(BigInteger)
    backend: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)


class Lease(Base):
    """A running trial's owner and heartbeat (database clock, epoch seconds)."""

    __tablename__ = "tuner_leases"
    trial_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    study: Mapped[str] = mapped_column(String(128), index=True)
    worker: Mapped[str] = mapped_column(String(128))
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    heartbeat_at: Mapped[float] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(16))  # running | done | reaped
    # Incremented by every reap and re-lease: a write that settles the trial checks it (`tuner.store.leases.Fence`).
    epoch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # When the lease began (database clock): a trial past its deadline is reaped whatever its heartbeat says.
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class StudyRecord(Base):
    """What a study was created from, to refuse resuming it with an incompatible study file."""

    __tablename__ = "tuner_studies"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    uid: Mapped[str] = mapped_column(String(32))  # unique per created study: keys its trial folders in the work dir
    fingerprint: Mapped[dict[str, Any]] = mapped_column(JSON)
    spec_text: Mapped[str] = mapped_column(Text)  # the study file with credentials masked
    created_at: Mapped[float] = mapped_column(Float)
