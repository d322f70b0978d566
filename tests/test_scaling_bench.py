"""bench/scaling.py's arithmetic: overhead per trial including tell, and speedups within repetitions."""

from __future__ import annotations

from datetime import datetime, timedelta

from optuna.trial import FrozenTrial, TrialState

from bench.scaling import cycle_overheads, main, paired_ratios, summarise

T0 = datetime(2026, 12, 1, 8, 30)


def _trial(number: int, worker: str, start_s: float, wall_s: float, overhead_s: float) -> FrozenTrial:
    start = T0 + timedelta(seconds=start_s)
    return FrozenTrial(
        number=number,
        state=TrialState.COMPLETE,
        value=1.0,
        datetime_start=start,
        datetime_complete=start + timedelta(seconds=wall_s),
        params={},
        distributions={},
        user_attrs={"worker": worker, "trial_wall_s": wall_s, "overhead_s": overhead_s},
        system_attrs={},
        intermediate_values={},
        trial_id=number,
    )


def test_overhead_per_trial_counts_everything_between_two_asks_but_the_childs_phases() -> None:
    # worker w0: child phases 2.0 s each (wall 2.3 - overhead 0.3); the next trial starts 2.5 s later
    trials = [
        _trial(0, "w0", 0.0, 2.3, 0.3),
        _trial(1, "w1", 0.1, 2.2, 0.2),
        _trial(2, "w0", 2.5, 2.3, 0.3),
        _trial(3, "w1", 2.9, 2.2, 0.2),
        _trial(4, "w0", 5.0, 2.3, 0.3),
    ]
    assert sorted(round(v, 6) for v in cycle_overheads(trials)) == [0.5, 0.5, 0.8]


def test_speedups_are_taken_within_each_repetition() -> None:
    runs = [
        {
            "workers": n,
            "rep": rep,
            "wall_s": wall,
            "trials_per_min_window": 60 * 16 / (wall - 2),
            "trials_per_min_end_to_end": 60 * 16 / wall,
            "overhead_incl_tell_s_median": 0.1,
            "overhead_incl_tell_s_p90": 0.2,
            "overhead_s_median": 0.05,
            "host_cpu_busy": 0.5,
            "db_transactions_per_trial": 120.0,
            "wal_flushes_per_trial": 14.0,
        }
        for rep, (w1, w2) in enumerate(((40.0, 20.0), (80.0, 40.0), (40.0, 25.0)))
        for n, wall in ((1, w1), (2, w2))
    ]
    two = summarise(runs)[1]
    assert two["speedup_end_to_end"] == {
        "median": 2.0,
        "min": 1.6,
        "max": 2.0,
    }  # a slow repetition cancels in its own ratio
    assert two["target_end_to_end"] == 1.6 and two["reps"] == 3


def test_the_other_trees_time_is_compared_within_each_repetitions_pair() -> None:
    walls = {("now", 4, 0): 20.0, ("then", 4, 0): 25.0, ("now", 4, 1): 40.0, ("then", 4, 1): 44.0, ("now", 4, 2): 20.0}
    runs = [{"tree": tree, "workers": n, "rep": rep, "wall_s": wall} for (tree, n, rep), wall in walls.items()]
    assert paired_ratios(runs) == [{"workers": 4, "pairs": 2, "median": 1.175, "min": 1.1, "max": 1.25}]


def test_bad_worker_counts_are_refused_in_one_line(capsys) -> None:
    assert main(["--workers", "2,4"]) == 2
    assert main(["--workers", "one"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("error: --workers must start with 1") and err[1].startswith("error: --workers 'one'")
