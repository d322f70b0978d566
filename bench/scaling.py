"""Scaling benchmark: N workers (1, 2, 4, 8) on one PostgreSQL study with trials of fixed cost, end to end.

For each repetition, and within it for each worker count in turn (so the counts compared are measured
close together), one `tuner run` command runs a fresh study of `--trials` trials whose build sleeps
`--build-s` seconds. Per run it records:
- *end to end*: the command's wall time from its start to its exit (what a user waits for), and the
  throughput that gives; the speedup over one worker is taken within each repetition;
- *window*: trials per minute between the first trial's start and the last one's end (the figure
  the earlier version of this benchmark reported);
- *overhead per trial including tell*: for each worker, the time between the starts of two
  consecutive trials minus the child's own phases of the first (`trial_wall_s - overhead_s`), so it
  counts asking under the study lock, leasing, the cache, starting the child, keeping artifact and
  log, the outcome's writes and `tell`, the dashboard-note update and reserving the next trial; and
  the worker's own `overhead_s` attribute (which stops before `tell`) beside it;
- the machine's load: load averages before and after, and the share of CPU time the whole host
  spent busy during the run (/proc/stat), since other jobs may share the machine;
- the database's share: transactions committed in the study's own (fresh) database and WAL flushes
  of the whole cluster during the run (`pg_stat_database`, `pg_stat_wal`), per trial, the command's
  start and end included (a read-only transaction is a round trip; a flush waits for the disk).
The file names the commit and the machine (CPU model, platform) it was measured at. With `--against REV`
every run is made twice, with this tree and with commit REV (unpacked from git, `bench.measurement.unpack`), one
right after the other (which goes first alternates between repetitions), and the file records REV's runs
and, per worker count, REV's end-to-end time over this tree's within each pair.
Writes bench/results/scaling.json. Usage:
    python bench/scaling.py [--pg postgresql://postgres@127.0.0.1/postgres] [--reps 3] [--idle-build] [--block-s 0.005]
                            [--against REV] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
import psycopg2
from optuna.trial import FrozenTrial

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import commit, describe  # noqa: E402
from bench.measurement import unpack  # noqa: E402
from tests.models import conv_model  # noqa: E402
from tuner.spec.toml import dumps  # noqa: E402
from tuner.store.urls import normalize_url  # noqa: E402
from tuner.study import attrs as A  # noqa: E402
from tuner.worker.forkserver import ENABLE_ENV as FORK_ENV  # noqa: E402


def _database(admin: str) -> str:
    name = f"tuner_bench_{uuid.uuid4().hex[:8]}"
    conn = psycopg2.connect(admin)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    return admin.rsplit("/", 1)[0] + "/" + name


def _drop(admin: str, url: str) -> None:
    conn = psycopg2.connect(admin)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(
            f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)'
        )  # this process's Optuna engine may still hold a connection
    conn.close()


def database_counts(admin: str, url: str) -> tuple[int, int]:
    """(transactions committed in `url`'s database, WAL flushes of the cluster) so far."""
    conn = psycopg2.connect(admin)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(
            "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = %s), wal_sync FROM pg_stat_wal",
            (url.rsplit("/", 1)[1],),
        )
        commits, syncs = cur.fetchone()
    conn.close()
    return int(commits or 0), int(syncs)


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole host since boot, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def cycle_overheads(trials: Sequence[FrozenTrial]) -> list[float]:
    """Per worker, the gap between consecutive trial starts minus the earlier trial's child phases."""
    out: list[float] = []
    by_worker: dict[str, list[FrozenTrial]] = {}
    for t in trials:
        if t.datetime_start and A.TRIAL_WALL_S in t.user_attrs and A.OVERHEAD_S in t.user_attrs:
            by_worker.setdefault(str(t.user_attrs.get(A.WORKER, "")), []).append(t)
    for ts in by_worker.values():
        ts.sort(key=lambda t: t.datetime_start)
        for a, b in zip(ts, ts[1:]):
            child = float(a.user_attrs[A.TRIAL_WALL_S]) - float(a.user_attrs[A.OVERHEAD_S])
            out.append((b.datetime_start - a.datetime_start).total_seconds() - child)
    return out


def _q(values: Sequence[float], q: float) -> float | None:
    return round(sorted(values)[int(q * (len(values) - 1))], 4) if values else None


def run_once(
    workers: int,
    trials: int,
    build_s: float,
    admin: str,
    tmp: Path,
    rep: int,
    idle_build: bool = False,
    fresh: bool = False,
    block_s: float | None = None,
    tree: Path = REPO,
) -> dict[str, Any]:
    """One `tuner run` of a fresh fixed-cost study with `workers` workers, measured end to end, with the tuner of
    the source tree `tree`."""
    url = _database(admin)
    name = f"scaling-{workers}-r{rep}"
    spec = tmp / f"{name}.toml"
    spec.write_text(
        dumps(
            {
                "study": {"name": name, "work_dir": str(tmp / f"work-{name}")},
                "model": {"path": str(tmp / "tiny.onnx")},
                "data": {"samples": 2, "gate_samples": 1},
                "accuracy": {"metric": "max_abs", "tolerance": 1e-3},
                # the tuner's own cost is measured, not the model: each paired timing is capped at 0.2 s beyond
                # its minimum cycles (6 of 4 blocks: 1.2 s at the default 50 ms blocks, ~0.15 s at 5 ms)
                "objective": {
                    "warmup_s": 0.0,
                    "min_repeats": 3,
                    "min_duration_s": 0.0,
                    "timing_cap_s": 0.2,
                    **({"block_s": block_s} if block_s is not None else {}),
                },
                "backend": {
                    "name": "bench.fixed_cost:FixedCostBackend",
                    "options": {"build_s": build_s, "idle_build": idle_build},
                },
                "run": {"budget": trials, "workers": workers, "sampler": "random", "heartbeat_s": 1.0, "racing": False},
            }
        )
    )
    db_before = database_counts(admin, url)
    load_before, cpu_before = os.getloadavg(), cpu_times()
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tuner", "run", str(spec), "--storage", url, "--no-confirm"],
        check=True,
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", **({FORK_ENV: "0"} if fresh else {})},
        capture_output=True,
    )
    wall = time.perf_counter() - t0
    cpu_after, load_after = cpu_times(), os.getloadavg()
    db_after = database_counts(admin, url)  # before this process reads the study
    ts = [t for t in optuna.load_study(study_name=name, storage=normalize_url(url)).trials if t.datetime_complete]
    _drop(admin, url)
    overhead = [float(t.user_attrs[A.OVERHEAD_S]) for t in ts if A.OVERHEAD_S in t.user_attrs]
    cycle = cycle_overheads(ts)
    span = (max(t.datetime_complete for t in ts) - min(t.datetime_start for t in ts)).total_seconds()
    busy = (cpu_after[0] - cpu_before[0]) / max(cpu_after[1] - cpu_before[1], 1)
    return {
        "workers": workers,
        "rep": rep,
        "trials": len(ts),
        "wall_s": round(wall, 3),
        "span_s": round(span, 3),
        "trials_per_min_end_to_end": round(60 * len(ts) / wall, 2),
        "trials_per_min_window": round(60 * len(ts) / span, 2),
        "overhead_incl_tell_s_median": _q(cycle, 0.5),
        "overhead_incl_tell_s_p90": _q(cycle, 0.9),
        "overhead_s_median": _q(overhead, 0.5),
        "overhead_s_p90": _q(overhead, 0.9),
        "loadavg_before": [round(v, 2) for v in load_before],
        "loadavg_after": [round(v, 2) for v in load_after],
        "host_cpu_busy": round(busy, 3),
        "db_transactions_per_trial": round((db_after[0] - db_before[0]) / max(len(ts), 1), 1),
        "wal_flushes_per_trial": round((db_after[1] - db_before[1]) / max(len(ts), 1), 1),
    }


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per worker count: medians over repetitions, and the speedups over one worker within each repetition."""
    one = {r["rep"]: r for r in runs if r["workers"] == 1}
    rows = []
    for n in sorted({r["workers"] for r in runs}):
        mine = [r for r in runs if r["workers"] == n]
        e2e = [one[r["rep"]]["wall_s"] / r["wall_s"] for r in mine if r["rep"] in one]
        win = [r["trials_per_min_window"] / one[r["rep"]]["trials_per_min_window"] for r in mine if r["rep"] in one]

        def med(k: str, rs: list[dict[str, Any]] = mine) -> float | None:
            vals = [r[k] for r in rs if r[k] is not None]
            return round(statistics.median(vals), 4) if vals else None

        rows.append(
            {
                "workers": n,
                "reps": len(mine),
                "speedup_end_to_end": {
                    "median": round(statistics.median(e2e), 3),
                    "min": round(min(e2e), 3),
                    "max": round(max(e2e), 3),
                }
                if e2e
                else None,
                "speedup_window": {
                    "median": round(statistics.median(win), 3),
                    "min": round(min(win), 3),
                    "max": round(max(win), 3),
                }
                if win
                else None,
                "target_end_to_end": round(0.8 * n, 2) if n <= 4 else None,
                **{
                    k: med(k)
                    for k in (
                        "wall_s",
                        "trials_per_min_end_to_end",
                        "trials_per_min_window",
                        "overhead_incl_tell_s_median",
                        "overhead_incl_tell_s_p90",
                        "overhead_s_median",
                        "host_cpu_busy",
                        "db_transactions_per_trial",
                        "wal_flushes_per_trial",
                    )
                },
            }
        )
    return rows


def paired_ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per worker count: the other tree's end-to-end time over this one's, within each repetition's pair."""
    by_key = {(r["tree"], r["workers"], r["rep"]): r["wall_s"] for r in runs}
    rows = []
    for n in sorted({r["workers"] for r in runs}):
        ratios = [
            by_key[("then", n, rep)] / by_key[("now", n, rep)]
            for rep in sorted({r["rep"] for r in runs})
            if ("then", n, rep) in by_key and ("now", n, rep) in by_key
        ]
        if ratios:
            rows.append(
                {
                    "workers": n,
                    "pairs": len(ratios),
                    "median": round(statistics.median(ratios), 3),
                    "min": round(min(ratios), 3),
                    "max": round(max(ratios), 3),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(prog="python bench/scaling.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--build-s", type=float, default=2.0)
    p.add_argument("--workers", default="1,2,4,8")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument(
        "--idle-build",
        action="store_true",
        help="builds leave the host's cores free (CPU timings do not wait for them); default: they hold them like a "
        "compiler",
    )
    p.add_argument(
        "--fresh-children",
        action="store_true",
        help="every trial child a fresh interpreter ($TUNER_FORK_SERVER=0), as before the pre-imported server",
    )
    p.add_argument(
        "--block-s",
        type=float,
        default=0.005,
        help="the paired timing's block length ([objective] block_s; 0 = the product's default, 50 ms on the CPU): "
        "the minimum cycles are exclusive per host, so at 50 ms they alone bound what 2 cores can overlap",
    )
    p.add_argument(
        "--against",
        metavar="REV",
        help="also run every study with commit REV's tuner, right beside this tree's, and record the pairs' ratios",
    )
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "scaling.json")
    args = p.parse_args(argv)
    block_s = args.block_s or None  # 0: the product's default
    try:
        counts = [int(n) for n in args.workers.split(",")]
    except ValueError:
        print(
            f"error: --workers {args.workers!r}: expected comma-separated worker counts, e.g. 1,2,4,8", file=sys.stderr
        )
        return 2
    if counts[0] != 1:
        print("error: --workers must start with 1 (speedups are relative to one worker)", file=sys.stderr)
        return 2
    runs = []
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    code, machine = commit(), describe()  # before the runs: the load average is then the machine's own
    against = commit(args.against) if args.against else None
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        then = unpack(args.against, tmp / "then") if args.against else None
        conv_model(tmp / "tiny.onnx")
        trees = {"now": REPO, **({"then": then} if then is not None else {})}
        for rep in range(args.reps):
            order = list(trees) if rep % 2 == 0 else list(reversed(trees))  # which tree goes first alternates
            for n, label in ((n, label) for n in counts for label in order):
                r = run_once(
                    n,
                    args.trials,
                    args.build_s,
                    args.pg,
                    tmp,
                    rep,
                    args.idle_build,
                    args.fresh_children,
                    block_s,
                    trees[label],
                )
                runs.append({"tree": label, **r})
                print(
                    f"rep {rep + 1} workers {n} {label}: {r['wall_s']} s end to end, overhead incl. tell "
                    f"{r['overhead_incl_tell_s_median']} s, load {r['loadavg_before'][0]}->{r['loadavg_after'][0]}, "
                    f"host busy {r['host_cpu_busy']:.0%}, {r['db_transactions_per_trial']} transactions and "
                    f"{r['wal_flushes_per_trial']} WAL flushes per trial",
                    flush=True,
                )
    doc = {
        "benchmark": "scaling",
        "started": started,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "build_s": args.build_s,
        "idle_build": args.idle_build,
        "block_s": block_s or "default (50 ms)",
        "children": "fresh" if args.fresh_children else "forked",
        "trials_per_run": args.trials,
        "reps": args.reps,
        "cores": os.cpu_count(),
        "commit": code,
        "machine": machine,
        "method": __doc__.split("\n\n")[1].strip(),
        "rows": summarise([r for r in runs if r["tree"] == "now"]),
        "runs": [r for r in runs if r["tree"] == "now"],
        **(
            {
                "against": {
                    "commit": against,
                    "rows": summarise([r for r in runs if r["tree"] == "then"]),
                    "runs": [r for r in runs if r["tree"] == "then"],
                    "then_over_now_end_to_end": paired_ratios(runs),
                }
            }
            if against
            else {}
        ),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = args.out.with_name(f".{args.out.name}.tmp")
    tmp_out.write_text(json.dumps(doc, indent=2) + "\n")
    tmp_out.replace(args.out)
    print(f"{'workers':>7} {'end-to-end x':>13} {'window x':>9} {'overhead incl. tell (median)':>29}")
    for r in doc["rows"]:
        e, w = r["speedup_end_to_end"], r["speedup_window"]
        print(
            f"{r['workers']:>7} {e['median']:>8} [{e['min']}–{e['max']}] {w['median']:>6} "
            f"{r['overhead_incl_tell_s_median']:>10} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
