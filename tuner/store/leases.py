"""Leases: every running trial has an owner and a heartbeat on the database clock.

A trial whose owner is gone (SIGKILL, power loss) stops beating; any live worker, or the next
`tuner run`, sees its lease expire and reaps it. A lease owned by a dead process on this very host
(same boot and PID namespace, not merely the same hostname) is reaped at once. A RUNNING trial
without a lease (its worker died between asking and leasing) is given an ownerless lease when first
seen, so it ages on the database clock too, never on a host's own clock.

Every lease carries an epoch that each reap and re-lease increments. A write that settles a trial
(its outcome, its measurement and cache rows) holds its `Fence` in the same transaction: a worker
whose lease was reaped while it was stopped gets `LeaseLost` and writes nothing.
"""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, false, func, select, update
from sqlalchemy.orm import Session

from tuner.store.db import OUTAGE, db_clock, db_epoch, get_engine, retried
from tuner.store.models import Lease


def host_identity() -> str:
    """This host as seen by PID checks: hostname, boot id and PID namespace.

    Containers may share a hostname; only a process with the same boot id and PID namespace can
    tell whether a PID is alive, so leases written elsewhere are judged by their heartbeat alone.
    """
    parts = [socket.gethostname()]
    try:
        parts.append("boot=" + Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:13])
        parts.append("pidns=" + os.readlink("/proc/self/ns/pid").removeprefix("pid:[").rstrip("]"))
    except OSError:  # not Linux: the hostname is all there is
        pass
    return " ".join(parts)


HOST = host_identity()
UNOWNED = "?"  # worker name of a lease recorded for a RUNNING trial found without one


@dataclass(frozen=True)
class Owner:
    """Who holds a lease."""

    worker: str
    host: str = HOST
    pid: int = field(default_factory=os.getpid)


class LeaseLost(Exception):
    """The lease a write was fenced by is no longer its holder's: the trial was reaped (or re-leased)."""


@dataclass(frozen=True)
class Fence:
    """A lease as one holder took it: the trial, the epoch, and the state the holder left it in."""

    trial_id: int
    epoch: int
    state: str = "running"  # the owner's; a reaper's fence is "reaped"

    def hold(self, conn: Connection, settle: bool = False) -> None:
        """In the caller's transaction: lock the lease and check it is still this holder's; else `LeaseLost`.

        With `settle` an owner's lease ends (`done`) in the same transaction, so no reap can claim it
        after the outcome is written. A lease this owner already settled (an earlier attempt committed,
        its reply lost) still holds: the caller finds the trial finished and writes nothing again.
        """
        target = "done" if settle and self.state == "running" else self.state
        held = conn.execute(
            update(Lease)
            .where(Lease.trial_id == self.trial_id, Lease.epoch == self.epoch, Lease.state == self.state)
            .values(state=target)
        )
        if held.rowcount == 1:
            return
        row = conn.execute(select(Lease.state, Lease.epoch).where(Lease.trial_id == self.trial_id)).first()
        if row is not None and row.epoch == self.epoch and row.state == "done" and self.state == "running":
            return
        now = "no lease" if row is None else f"{row.state} at epoch {row.epoch}"
        raise LeaseLost(f"trial id {self.trial_id}: lease epoch {self.epoch} is no longer current ({now})")


class Leases:
    """Lease operations for one storage URL and study."""

    def __init__(self, url: str, study: str) -> None:
        self.engine = get_engine(url)
        self.study = study

    @retried
    def take(self, trial_id: int, owner: Owner) -> Fence:
        """Start a lease on a trial that was just asked for (replacing an ownerless one, at the next epoch)."""
        with Session(self.engine) as s, s.begin():
            now = db_epoch(s)
            values = {
                "study": self.study,
                "worker": owner.worker,
                "host": owner.host,
                "pid": owner.pid,
                "heartbeat_at": now,
                "started_at": now,
                "state": "running",
            }
            s.execute(
                _insert(s)
                .values(trial_id=trial_id, epoch=1, **values)
                .on_conflict_do_update(index_elements=["trial_id"], set_={**values, "epoch": Lease.epoch + 1})
            )
            return Fence(trial_id, s.scalars(select(Lease.epoch).where(Lease.trial_id == trial_id)).one())

    def beat(self, fence: Fence) -> bool:
        """Refresh the heartbeat of a running lease; False if it is no longer this holder's.

        One statement, committed as it runs: a holder frozen at any moment of its beat (SIGSTOP) keeps no lock
        on its lease, so a reaper never waits for it."""
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            done = conn.execute(
                update(Lease)
                .where(Lease.trial_id == fence.trial_id, Lease.epoch == fence.epoch, Lease.state == "running")
                .values(heartbeat_at=db_clock(conn.dialect.name))
            )
            return done.rowcount == 1

    @retried
    def expired(
        self, running_trial_ids: list[int], grace_s: float, deadline_s: float = math.inf, distrust_s: float = 0.0
    ) -> list[int]:
        """Which of the RUNNING trials have lost their owner (to be confirmed by `claim_reap`).

        A lease is expired when its heartbeat is older than `grace_s` by the database clock, or its
        owner is a dead process on this host, or it began more than `deadline_s` ago (a trial's
        wall-clock deadline, whatever its heartbeat says: a worker whose thread beats while the trial
        is stuck). A RUNNING trial with no lease gets an ownerless one
        stamped now (database clock), so it expires `grace_s` after it was first seen. A RUNNING
        trial whose lease is already reaped lost its reaper midway (it died holding the study lock).
        While this process sees the database away, or saw it come back less than `distrust_s` ago
        (`_heartbeats_distrusted`), every heartbeat may be stale: only dead owners (and dead reapers) count.
        """
        if not running_trial_ids:
            return []
        with Session(self.engine) as s, s.begin():
            now = db_epoch(s)
            rows = {r.trial_id: r for r in s.scalars(select(Lease).where(Lease.trial_id.in_(running_trial_ids)))}
            for tid in running_trial_ids:
                if tid not in rows:
                    s.execute(
                        _insert(s)
                        .values(
                            trial_id=tid,
                            study=self.study,
                            worker=UNOWNED,
                            host=UNOWNED,
                            pid=0,
                            heartbeat_at=now,
                            started_at=now,
                            state="running",
                        )
                        .on_conflict_do_nothing(index_elements=["trial_id"])
                    )
            if _heartbeats_distrusted(distrust_s):
                grace_s = deadline_s = math.inf
            return [tid for tid, lease in rows.items() if _lost(lease, now, grace_s, deadline_s)]

    @retried
    def claim_reap(
        self, trial_id: int, grace_s: float, deadline_s: float = math.inf, distrust_s: float = 0.0
    ) -> Fence | None:
        """Mark a lost lease reaped at the next epoch, in one conditional UPDATE; None if its owner turned out alive.

        Claimed only if the lease is still running and, at this moment by the database clock, its
        heartbeat is older than `grace_s`, or it began more than `deadline_s` ago, or its owner is a
        dead process on this host (or it was reaped by a reaper that died before failing the trial);
        heartbeats and deadlines count only where `expired` counts them (`distrust_s`). Call under the
        study lock, after checking that the trial is still RUNNING, before failing it with the returned
        fence: from now on the owner's writes are refused, and so are those of an earlier reaper of the
        same lease.
        """
        with Session(self.engine) as s, s.begin():
            now = db_epoch(s)
            stale = (
                false()
                if _heartbeats_distrusted(distrust_s)
                else (Lease.heartbeat_at < now - grace_s)
                | (func.coalesce(Lease.started_at, Lease.heartbeat_at) < now - deadline_s)
            )
            lease = s.get(Lease, trial_id)
            if lease is not None and _dead_here(lease):
                stale = stale | ((Lease.host == lease.host) & (Lease.pid == lease.pid))
            claimable = ((Lease.state == "running") & stale) | (
                Lease.state == "reaped"
            )  # reaped: finish a dead reaper's job
            done = s.execute(
                update(Lease)
                .where(Lease.trial_id == trial_id, claimable)
                .values(state="reaped", epoch=Lease.epoch + 1)
                .execution_options(synchronize_session=False)
            )
            if done.rowcount != 1:
                return None
            return Fence(trial_id, s.scalars(select(Lease.epoch).where(Lease.trial_id == trial_id)).one(), "reaped")


def _insert(session: Session) -> Any:
    """An INSERT of a lease with the dialect's ON CONFLICT clauses (PostgreSQL and SQLite both have them)."""
    if session.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(Lease)


def _heartbeats_distrusted(window_s: float) -> bool:
    """Whether this process sees the database away or saw it come back less than `window_s` ago (`OUTAGE`).

    Asked once the database has answered, inside the retried call: a call that waited out an outage finds every
    heartbeat stale (no owner could beat meanwhile), and its own retries mark the outage until it returns."""
    return OUTAGE.recent(window_s)


def _lost(lease: Lease, now: float, grace_s: float, deadline_s: float) -> bool:
    if lease.state == "reaped":
        return True
    started = lease.heartbeat_at if lease.started_at is None else lease.started_at
    return lease.state == "running" and (
        now - lease.heartbeat_at > grace_s or now - started > deadline_s or _dead_here(lease)
    )


def _dead_here(lease: Lease) -> bool:
    return lease.host == HOST and lease.pid > 0 and not _alive(lease.pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def may_be_alive(lease: Lease, now: float, hold_s: float) -> bool:
    """Whether a lease's owner may still be running: on this host, while its PID lives; elsewhere, for `hold_s`
    after its last heartbeat by the database clock `now` (nothing else can be known from here)."""
    if lease.host == HOST:
        return lease.pid > 0 and _alive(lease.pid)
    return now - lease.heartbeat_at < hold_s
