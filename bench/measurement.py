"""Measurement benchmark: does the study's speedup agree with a side-by-side re-measurement, and what does timing cost?

For each configuration (this checkout's code, or `--before REV`'s code unpacked from git, with N
workers) the bundled CPU study (studies/efficientnet_lite0.toml) runs from scratch on a fresh
PostgreSQL database with `--trials T`, followed by its end-of-study confirmation (the default route
and the top 3 re-measured in fresh processes over interleaved rounds: the side-by-side measurement).
Recorded per configuration:

- agreement: the speedup the study reports for its best candidate (this code: the paired, refined
  speedup of the best confirmed trial, else of the best paired trial; before: baseline value / best
  value; when that trial was not among the confirmed candidates, the route the confirmation reports)
  against the confirmation's estimate for the same trial; `agreement` = study / confirmation;
- the between-round CV of the confirmation winner's round medians;
- cost: the timing phase's seconds per trial (this code: lock wait, baseline load, warm-up and
  measurement; the lock wait and the warm-up + measurement also apart) and their share of trial
  wall time (cache hits and never-timed trials excluded);
- the machine: CPU count, load average before and after, the measurement records' load averages.

Writes bench/results/measurement.json (merging into an existing file: one key per configuration).

`--h200 FILE` folds the H200 agreement run (bench/gpu/measure_agreement.py's output, e.g.
bench/results/gpu-measurement.json) into the same document under `h200`, without running anything.

Usage: python bench/measurement.py [--workers 1 2] [--trials 16] [--before REV] [--tag r2] [--admin URL] [--h200 FILE]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "studies" / "efficientnet_lite0.toml"
OUT = REPO / "bench" / "results" / "measurement.json"


def unpack(rev: str, dest: Path) -> Path:
    """The tree of git revision `rev`, unpacked into `dest` (no worktree, nothing written to the repository)."""
    data = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    # older code looked for `tuner.migrations` first, which this checkout's editable install answers with
    # *its* migrations; give the unpacked package its own
    if (dest / "migrations").is_dir() and not (dest / "tuner" / "migrations").exists():
        (dest / "tuner" / "migrations").symlink_to(dest / "migrations", target_is_directory=True)
    return dest


def study_file(code: Path, work: Path, name: str) -> Path:
    """The bundled study file with absolute model/data paths, a fresh name and work directory."""
    text = (code / "studies" / "efficientnet_lite0.toml").read_text()
    models = code / "models"
    text = text.replace('"../models/', f'"{models}/').replace(
        'name = "efficientnet-lite0-cpu"', f'name = "{name}"\nwork_dir = "{work}"'
    )
    path = work.parent / f"{name}.toml"
    path.write_text(text)
    return path


def database(admin: str) -> str:
    """A fresh PostgreSQL database; its URL."""
    import psycopg2

    name = f"tuner_bench_measure_{uuid.uuid4().hex[:10]}"
    conn = psycopg2.connect(admin)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    return f"{admin.rsplit('/', 1)[0]}/{name}".replace("postgresql://", "postgresql+psycopg2://", 1)


def run_config(
    code: Path, label: str, workers: int, trials: int, admin: str, tmp: Path, confirm: bool = True
) -> dict[str, Any]:
    """Run the study with `code` and `workers`, confirm (unless told not to: cost only), and measure agreement and
    cost."""
    name = f"bench-{label}-{workers}w"
    spec = study_file(code, tmp / name, name)
    url = database(admin)
    env = {**os.environ, "PYTHONPATH": str(code)}
    load_before = os.getloadavg()
    t0 = time.time()
    cmd = [
        sys.executable,
        "-m",
        "tuner",
        "run",
        str(spec),
        "--storage",
        url,
        "--workers",
        str(workers),
        "--trials",
        str(trials),
    ]
    run = subprocess.run(cmd + ([] if confirm else ["--no-confirm"]), cwd=code, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    out: dict[str, Any] = {
        "code": label,
        "workers": workers,
        "trials": trials,
        "confirmed": confirm,
        "returncode": run.returncode,
        "wall_s": round(wall, 1),
        "load_before": [round(v, 2) for v in load_before],
        "load_after": [round(v, 2) for v in os.getloadavg()],
        "cpus": os.cpu_count(),
        "stdout_tail": run.stdout[-1500:],
    }
    if run.returncode != 0:
        out["stderr_tail"] = run.stderr[-3000:]
        return out
    reader = subprocess.run([sys.executable, "-c", READ, url, name], cwd=code, env=env, capture_output=True, text=True)
    if reader.returncode != 0:
        out["read_error"] = reader.stderr[-3000:]
        return out
    out.update(json.loads(reader.stdout))
    return out


# Runs under the configuration's own code (PYTHONPATH), so "before" is read with the code that wrote it.
READ = r"""
import json, statistics, sys
import optuna
from sqlalchemy import create_engine, text
from optuna.trial import TrialState
url, name = sys.argv[1], sys.argv[2]
study = optuna.load_study(study_name=name, storage=url)
trials = study.get_trials(deepcopy=False)
conf = study.user_attrs.get("confirmation", {})
racing = study.user_attrs.get("racing", {})
base = next(t for t in trials if t.user_attrs.get("source") == "baseline" and t.state == TrialState.COMPLETE)
feasible = [t for t in trials if t.state == TrialState.COMPLETE and all(v <= 0 for v in t.constraints.values())
            and t.number != base.number]

def study_speedup(t):
    r = racing.get(str(t.number), {})
    if "speedup_refined" in r:
        return r["speedup_refined"], r["speedup_refined_ci"], "refined"
    if t.user_attrs.get("paired"):
        return t.user_attrs["speedup_paired"], t.user_attrs["speedup_paired_ci"], "paired"
    return base.value / t.value, None, "values"

confirmed = sorted((t for t in feasible if racing.get(str(t.number), {}).get("confirmed")),
                   key=lambda t: -study_speedup(t)[0])
best = confirmed[0] if confirmed else (min(feasible, key=lambda t: t.value) if feasible else None)
rows = []
for c in conf.get("candidates", []):
    t = next(t for t in trials if t.number == c["trial"])
    s, ci, how = study_speedup(t)
    rows.append({"trial": c["trial"], "study_speedup": s, "study_ci": ci, "study_speedup_from": how,
                 "confirm_speedup": c.get("speedup"), "confirm_ci": [c.get("low"), c.get("high")],
                 "agreement": s / c["speedup"] if c.get("speedup") else None})
engine = create_engine(url)
with engine.connect() as db:
    rounds = [json.loads(r[0]) if isinstance(r[0], str) else r[0] for r in db.execute(
        text("SELECT stats FROM tuner_measurements WHERE study = :s AND kind = 'confirm' AND trial_number = :n "
             "ORDER BY id"),
        {"s": name, "n": conf.get("trial", -1)})]
    cached = {r[0]: (json.loads(r[1]) if isinstance(r[1], str) else r[1]) for r in db.execute(
        text("SELECT trial_number, result FROM tuner_results WHERE study = :s"), {"s": name})}
    loads = [json.loads(r[0]) if isinstance(r[0], str) else r[0] for r in db.execute(
        text("SELECT timing_info FROM tuner_measurements WHERE study = :s AND kind = 'trial'"), {"s": name})]
medians = [r["median"] for r in rounds]
timing, walls, waits, measuring, baseline_waits = [], [], [], [], []
for t in trials:
    if not t.state.is_finished() or t.user_attrs.get("cache_hit") or "trial_wall_s" not in t.user_attrs:
        continue
    phases = t.user_attrs.get("phase_s") or (cached.get(t.number) or {}).get("phase_s") or {}
    if "time" not in phases:
        continue  # never timed (gate failure, build error)
    timing.append(float(phases["time"]))
    walls.append(float(t.user_attrs["trial_wall_s"]))
    info = t.user_attrs.get("timing") or {}
    baseline_waits.append(float(info.get("baseline_wait_s", 0.0)) + float(info.get("baseline_load_s", 0.0)))
    if "lock_wait_s" in info:
        waits.append(float(info["lock_wait_s"]))
        measuring.append(float(info.get("seconds", 0.0))
                         + sum(float(w.get("seconds", 0.0)) for w in (info.get("warmup") or {}).values()))
headline = next((r for r in rows if best is not None and r["trial"] == best.number), None) or next(
    (r for r in rows if r["trial"] == conf.get("trial")), None)  # not among the candidates: the route it reports
print(json.dumps({
    "baseline_ms": base.value, "best_trial": best.number if best else None, "best_confirmed_in_study": bool(confirmed),
    "study_speedup": headline["study_speedup"] if headline else None,
    "confirm_speedup_same_trial": headline["confirm_speedup"] if headline else None,
    "agreement": headline["agreement"] if headline else None,
    "confirmation": {
        k: conf.get(k) for k in ("verdict", "message", "trial", "speedup", "ci", "rounds", "default_median_ms")
    },
    "candidates": rows, "winner_round_medians_ms": medians,
    "winner_between_round_cv": statistics.pstdev(medians) / statistics.mean(medians) if len(medians) > 1 else None,
    "timing_s_per_trial_median": statistics.median(timing) if timing else None, "timing_s_total": sum(timing),
    "trial_wall_s_median": statistics.median(walls) if walls else None,
    "timing_share_of_wall": sum(timing) / sum(walls) if walls else None, "trials_timed": len(timing),
    "lock_wait_s_median": statistics.median(waits) if waits else None,
    "baseline_wait_and_load_s_median": statistics.median(baseline_waits) if baseline_waits else None,
    "warmup_and_measuring_s_median": statistics.median(measuring) if measuring else None,
    "slow_pruned": sum(1 for t in trials if t.user_attrs.get("failure_class") == "slow"),
    "races": {
        k: {kk: v.get(kk) for kk in ("speedup_refined", "speedup_refined_ci", "remeasured", "confirmed")}
        for k, v in racing.items()
    },
    "exclusive_timings": sum(1 for i in loads if i.get("exclusive")), "measurements": len(loads),
    "trial_loadavg_1min": [i["loadavg_before"][0] for i in loads if "loadavg_before" in i],
}))
"""


def h200_summary(run: dict[str, Any], source: str) -> dict[str, Any]:
    """The agreement, drift and cost figures of one H200 run, with the machine state they were measured in."""
    trials = run.get("trials", [])
    winner = next((t for t in trials if t["number"] == run.get("agreement", {}).get("winner_trial")), {})
    baseline = next((t for t in trials if t["number"] == 0), {})
    sbs = run.get("side_by_side", {})
    paired = sbs.get("paired", {})
    return {
        "source": f"bench/results/{source}",
        "gpu": run.get("environment", {}).get("timer", {}).get("gpu"),
        "clocks": {
            k: run.get("environment", {}).get("timer", {}).get(k)
            for k in ("sm_clock_mhz", "mem_clock_mhz", "sm_clock_max_mhz")
        },
        "agreement": run.get("agreement"),
        "winner_trial_timing": winner.get("timing"),
        "winner_phase_s": winner.get("phase_s"),
        "baseline_latency_in_baseline_trial_ms": (baseline.get("latency_ms") or {}).get("median"),
        "baseline_latency_in_winner_trial_ms": (winner.get("baseline_latency_ms") or {}).get("median"),
        "winner_latency_in_its_trial_ms": (winner.get("latency_ms") or {}).get("median"),
        "side_by_side_rounds": {
            label: {k: sbs.get(label, {}).get(k) for k in ("median_ms", "round_medians_ms", "cv_between_rounds")}
            for label in ("default", "winner")
        },
        "side_by_side_paired": {
            k: paired.get(k)
            for k in (
                "speedup",
                "ci",
                "halfwidth",
                "cycles",
                "seconds",
                "cycle_speedup",
                "default_block_ms",
                "winner_block_ms",
            )
        },
        "baseline_reload_s": (winner.get("timing") or {}).get("baseline_load_s"),
        "time_phase_s": {t["number"]: (t.get("phase_s") or {}).get("time") for t in trials},
        "build_phase_s": {t["number"]: (t.get("phase_s") or {}).get("build") for t in trials},
    }


def _x(v: Any) -> str:
    return f"{v:.2f}x" if isinstance(v, int | float) else "-"


def _pct(v: Any) -> str:
    return f"{v:.1%}" if isinstance(v, int | float) else "-"


def _diff(v: Any) -> str:
    return f"{v - 1:+.1%}" if isinstance(v, int | float) else "-"


def _s(v: Any) -> str:
    return f"{v:.1f} s" if isinstance(v, int | float) else "-"


def table(doc: dict[str, Any]) -> str:
    """The Markdown table of the document's figures, for docs/benchmarks.md."""
    lines = [
        "| run | study speedup (best) | side by side (confirmation) | study / side by side | winner's between-round "
        "CV | timing per trial (median) | lock wait, warm-up + measuring (median) | timing share of trial wall | load "
        "average (1 min) during trials |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, c in doc.get("configs", {}).items():
        loads = c.get("trial_loadavg_1min") or []
        load = (
            f"{min(loads):.1f}-{max(loads):.1f}"
            if loads
            else f"{c.get('load_before', ['-'])[0]}-{c.get('load_after', ['-'])[0]}"
        )
        parts = (c.get("lock_wait_s_median"), c.get("warmup_and_measuring_s_median"))
        lines.append(
            f"| {key}, {c.get('trials')} trials | {_x(c.get('study_speedup'))} | "
            f"{_x(c.get('confirm_speedup_same_trial'))} | {_diff(c.get('agreement'))} | "
            f"{_pct(c.get('winner_between_round_cv'))} | {_s(c.get('timing_s_per_trial_median'))} | "
            f"{_s(parts[0]) if parts[0] is not None else '-'}, {_s(parts[1]) if parts[1] is not None else '-'} | "
            f"{_pct(c.get('timing_share_of_wall'))} | {load} |"
        )
    h = doc.get("h200")
    if h:
        a = h.get("agreement") or {}
        w = h.get("winner_trial_timing") or {}
        lines.append(
            f"| H200 Inductor, 1 GPU, 2 trials | {_x(a.get('study_speedup'))} | "
            f"{_x(a.get('side_by_side_rounds_speedup'))} rounds, {_x(a.get('side_by_side_paired_speedup'))} paired | "
            f"{_diff(a.get('study_vs_rounds'))} | {_pct(a.get('winner_between_round_cv'))} (paired interval "
            f"±{_pct(w.get('halfwidth'))}) | {_s((h.get('winner_phase_s') or {}).get('time'))} | "
            f"{_s(w.get('lock_wait_s'))}, {_s(w.get('seconds'))} | - | {w.get('loadavg_before', ['-'])[0]} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="*", default=[1, 2])
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--before", default=None, help="git revision whose code is measured too (the 'before' figures)")
    p.add_argument("--before-workers", type=int, nargs="+", default=[1])
    p.add_argument("--before-trials", type=int, default=None, help="budget of the 'before' runs (default: --trials)")
    p.add_argument(
        "--before-no-confirm", action="store_true", help="the 'before' runs measure cost only (no confirmation)"
    )
    p.add_argument("--admin", default=os.environ.get("TUNER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"))
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument(
        "--tag", default="", help="suffix of the configurations' keys (e.g. r2: a repetition kept beside the first)"
    )
    p.add_argument("--h200", type=Path, default=None, help="fold this H200 agreement run into the document and stop")
    p.add_argument("--table", action="store_true", help="print the docs/benchmarks.md table of --out and stop")
    args = p.parse_args()
    if args.table:
        print(table(json.loads(args.out.read_text())))
        return
    doc: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    doc.setdefault("benchmark", "measurement")
    doc.setdefault("configs", {})
    if args.h200:
        doc["h200"] = h200_summary(json.loads(args.h200.read_text()), args.h200.name)
        args.out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        print(json.dumps(doc["h200"], indent=1))
        return
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="tuner-measure-bench-") as tmp_name:
        tmp = Path(tmp_name)
        plan: list[tuple[Path, str, int, int, bool]] = []
        if args.before:
            before = unpack(args.before, tmp / "before-code")
            plan += [
                (before, f"before-{args.before}", w, args.before_trials or args.trials, not args.before_no_confirm)
                for w in args.before_workers
            ]
        plan = [(REPO, f"after-{head}", w, args.trials, True) for w in args.workers] + plan
        for code, label, workers, trials, confirm in plan:
            print(f"== {label}, {workers} worker(s), {trials} trials", flush=True)
            result = run_config(code, label, workers, trials, args.admin, tmp, confirm)
            doc["configs"][f"{label.split('-')[0]}-{workers}w" + (f"-{args.tag}" if args.tag else "")] = {
                **result,
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
            print(
                json.dumps(
                    {
                        k: result.get(k)
                        for k in (
                            "study_speedup",
                            "confirm_speedup_same_trial",
                            "agreement",
                            "winner_between_round_cv",
                            "timing_s_per_trial_median",
                            "timing_share_of_wall",
                            "wall_s",
                            "load_after",
                        )
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
