"""Leases: every running trial has an owner and a heartbeat on the database clock.

A trial whose owner is gone (SIGKILL, power loss) stops beating; any live worker, or the next
`tuner run`, sees its lease expire and reaps it. A lease owned by a dead process on the same host
is reaped at once, without waiting for the grace period.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tuner.store.db import db_epoch, get_engine, retried
from tuner.store.models import Lease

HOST = socket.gethostname()


@dataclass(frozen=True)
class Owner:
    """Who holds a lease."""

    worker: str
    host: str = HOST
    pid: int = os.getpid()


class Leases:
    """Lease operations for one storage URL and study."""

    def __init__(self, url: str, study: str) -> None:
        self.engine = get_engine(url)
        self.study = study

    @retried
    def take(self, trial_id: int, owner: Owner) -> None:
        """Start a lease on a trial that was just asked for."""
        with Session(self.engine) as s, s.begin():
            now = db_epoch(s)
            s.merge(Lease(trial_id=trial_id, study=self.study, worker=owner.worker, host=owner.host, pid=owner.pid,
                          heartbeat_at=now, state="running"))

    def beat(self, trial_id: int) -> None:
        """Refresh the heartbeat of a running lease."""
        with Session(self.engine) as s, s.begin():
            s.execute(update(Lease).where(Lease.trial_id == trial_id, Lease.state == "running").values(heartbeat_at=db_epoch(s)))

    @retried
    def release(self, trial_id: int) -> None:
        """The trial finished: its lease is done."""
        with Session(self.engine) as s, s.begin():
            s.execute(update(Lease).where(Lease.trial_id == trial_id).values(state="done"))

    @retried
    def expired(self, running_trial_ids: list[int], started_at: dict[int, float], grace_s: float,
                trust_heartbeats: bool = True) -> list[int]:
        """Which of the RUNNING trials have lost their owner.

        A lease is expired when its heartbeat is older than `grace_s` by the database clock, or its
        owner is a dead process on this host. A RUNNING trial with no lease at all (its worker died
        between asking and leasing) is expired once it is older than `grace_s`. With
        `trust_heartbeats` off (just after a database outage, when every heartbeat is stale) only
        dead owners count.
        """
        if not running_trial_ids:
            return []
        with Session(self.engine) as s:
            now = db_epoch(s)
            rows = {r.trial_id: r for r in s.scalars(select(Lease).where(Lease.trial_id.in_(running_trial_ids)))}
        lost = []
        for tid in running_trial_ids:
            lease = rows.get(tid)
            if lease is None:
                if trust_heartbeats and now - started_at.get(tid, now) > grace_s:
                    lost.append(tid)
            elif lease.state == "running" and ((trust_heartbeats and now - lease.heartbeat_at > grace_s)
                                               or (lease.host == HOST and not _alive(lease.pid))):
                lost.append(tid)
        return lost

    @retried
    def claim_reap(self, trial_id: int) -> bool:
        """Mark a lease reaped; False if it is no longer running. Call under the study lock."""
        with Session(self.engine) as s, s.begin():
            existing = s.get(Lease, trial_id)
            if existing is None:
                s.add(Lease(trial_id=trial_id, study=self.study, worker="?", host="?", pid=0, heartbeat_at=db_epoch(s), state="reaped"))
                return True
            if existing.state != "running":
                return False
            existing.state = "reaped"
            return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
