"""Exact trial budget across workers, hosts and restarts.

The count is taken under the study lock immediately before `ask`, so two workers cannot both take
the last slot. Counted: COMPLETE, PRUNED, RUNNING, and FAIL trials except those interrupted or lost
(which are re-queued and run again). Read with SQL on Optuna's tables (schema v3.2.0.a) because the
cached Optuna storage is not fresh across processes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import text

from tuner.store.db import get_engine
from tuner.study.outcome import UNCOUNTED


@dataclass(frozen=True)
class Counts:
    """Trial counts by state, plus how many FAIL trials are uncounted (interrupted or lost)."""

    complete: int = 0
    pruned: int = 0
    fail: int = 0
    running: int = 0
    waiting: int = 0
    uncounted_fail: int = 0

    @property
    def counted(self) -> int:
        """Trials that use up budget."""
        return self.complete + self.pruned + self.running + self.fail - self.uncounted_fail

    @property
    def finished(self) -> int:
        """Trials that finished and count."""
        return self.complete + self.pruned + self.fail - self.uncounted_fail


def count_trials(url: str, study_id: int) -> Counts:
    """Fresh counts for one study."""
    with get_engine(url).connect() as conn:
        rows = conn.execute(text("SELECT state, COUNT(*) FROM trials WHERE study_id = :s GROUP BY state"), {"s": study_id}).all()
        by_state = {str(state).split(".")[-1].upper(): n for state, n in rows}
        uncounted = _uncounted(conn, study_id)
    return Counts(
        complete=by_state.get("COMPLETE", 0), pruned=by_state.get("PRUNED", 0), fail=by_state.get("FAIL", 0),
        running=by_state.get("RUNNING", 0), waiting=by_state.get("WAITING", 0), uncounted_fail=uncounted,
    )


def _uncounted(conn: object, study_id: int) -> int:
    values = ", ".join(f"'{json.dumps(c)}'" for c in UNCOUNTED)
    sql = (
        "SELECT COUNT(*) FROM trials t JOIN trial_user_attributes a ON a.trial_id = t.trial_id "
        f"WHERE t.study_id = :s AND t.state = 'FAIL' AND a.key = 'failure_class' AND a.value_json IN ({values})"
    )
    return int(conn.execute(text(sql), {"s": study_id}).scalar())  # type: ignore[attr-defined]
