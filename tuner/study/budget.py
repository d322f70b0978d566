"""Exact trial budget across workers, hosts and restarts.

The count is taken under the study lock immediately before `ask`, so two workers cannot both take
the last slot. Counted: COMPLETE, PRUNED, RUNNING, and FAIL trials except those interrupted or lost
(which are re-queued and run again), and PRUNED known failures (no child ran: a product the route
needs had already failed; at most `budget` of them are free, so a study always ends). Read fresh
through `optuna_adapter` (SQL on Optuna's tables) because the cached Optuna storage is not fresh
across processes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tuner import job as J
from tuner.study import attrs as A
from tuner.study.optuna_adapter import count_by_state
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
    known_failures: int = 0

    @property
    def counted(self) -> int:
        """Trials that use up budget."""
        return self.complete + self.pruned + self.running + self.fail - self.uncounted_fail - self.known_failures

    def exhausted(self, budget: int) -> bool:
        """Whether no budget is left; known failures beyond the first `budget` of them count too."""
        return self.counted + max(0, self.known_failures - budget) >= budget

    def over(self, budget: int) -> bool:
        """Whether more than `budget` trials count (seen after an `ask`: that trial must not run)."""
        return self.counted + max(0, self.known_failures - budget) > budget

    @property
    def finished(self) -> int:
        """Trials that finished and count."""
        return self.complete + self.pruned + self.fail - self.uncounted_fail - self.known_failures


def count_trials(url: str, study_id: int) -> Counts:
    """Fresh counts for one study."""
    by_class = count_by_state(url, study_id, A.FAILURE_CLASS)

    def count(state: str, classes: Iterable[str] | None = None) -> int:
        return sum(n for (s, c), n in by_class.items() if s == state and (classes is None or c in classes))

    return Counts(
        complete=count("COMPLETE"),
        pruned=count("PRUNED"),
        fail=count("FAIL"),
        running=count("RUNNING"),
        waiting=count("WAITING"),
        uncounted_fail=count("FAIL", UNCOUNTED),
        known_failures=count("PRUNED", (J.KNOWN_FAILURE,)),
    )
