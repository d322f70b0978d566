"""Scaling benchmark: N workers (1, 2, 4, 8) on one PostgreSQL study with trials of fixed cost.

Reports throughput (trials per minute between the first trial's start and the last one's end)
relative to one worker and the tuner's overhead per trial (trial wall time not
spent inside the child's build/check/time phases), measured in one run, and writes
bench/results/scaling.json. Usage: python bench/scaling.py [--pg postgresql://postgres@127.0.0.1/postgres]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import optuna
import psycopg2

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import to_toml  # noqa: E402
from tests.models import conv_model  # noqa: E402
from tuner.store.urls import normalize_url  # noqa: E402


def _database(admin: str) -> str:
    name = f"tuner_bench_{uuid.uuid4().hex[:8]}"
    conn = psycopg2.connect(admin)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    return admin.rsplit("/", 1)[0] + "/" + name


def _run(workers: int, trials: int, build_s: float, admin: str, tmp: Path) -> dict:
    url = _database(admin)
    spec = tmp / f"scaling-{workers}.toml"
    spec.write_text(to_toml({
        "study": {"name": f"scaling-{workers}", "work_dir": str(tmp / f"work-{workers}")},
        "model": {"path": str(tmp / "tiny.onnx")},
        "data": {"samples": 2, "gate_samples": 1},
        "accuracy": {"metric": "max_abs", "tolerance": 1e-3},
        "objective": {"warmup_s": 0.0, "min_repeats": 3, "min_duration_s": 0.0},
        "backend": {"name": "bench.fixed_cost:FixedCostBackend", "options": {"build_s": build_s}},
        "run": {"budget": trials, "workers": workers, "sampler": "random", "heartbeat_s": 1.0},
    }))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tuner", "run", str(spec), "--storage", url, "--no-confirm"], check=True, cwd=REPO,
                   env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, capture_output=True)
    wall = time.perf_counter() - t0
    ts = optuna.load_study(study_name=f"scaling-{workers}", storage=normalize_url(url)).trials
    overhead = [t.user_attrs["overhead_s"] for t in ts if "overhead_s" in t.user_attrs]
    span = (max(t.datetime_complete for t in ts) - min(t.datetime_start for t in ts)).total_seconds()
    return {"workers": workers, "trials": len(ts), "wall_s": round(wall, 2), "span_s": round(span, 2), "trials_per_min": round(60 * len(ts) / span, 2),
            "overhead_s_median": round(statistics.median(overhead), 3), "overhead_s_p90": round(sorted(overhead)[int(0.9 * (len(overhead) - 1))], 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--build-s", type=float, default=2.0)
    p.add_argument("--workers", default="1,2,4,8")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        conv_model(tmp / "tiny.onnx")
        rows = [_run(int(n), args.trials, args.build_s, args.pg, tmp) for n in args.workers.split(",")]
    base = rows[0]["trials_per_min"]
    for r in rows:
        r["speedup_vs_1"] = round(r["trials_per_min"] / base, 2)
        r["ideal"] = r["workers"]
    doc = {"benchmark": "scaling", "build_s": args.build_s, "trials_per_run": args.trials, "cores": __import__("os").cpu_count(), "rows": rows}
    out = REPO / "bench" / "results" / "scaling.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{'workers':>7} {'trials/min':>10} {'x vs 1':>7} {'overhead/trial (median, p90)':>30}")
    for r in rows:
        print(f"{r['workers']:>7} {r['trials_per_min']:>10} {r['speedup_vs_1']:>7} {r['overhead_s_median']:>14} s, {r['overhead_s_p90']} s")


if __name__ == "__main__":
    main()
