"""A/A false-win rate: studies whose routes are all the same engine must (almost) never report a speedup.

    python bench/aa.py replay [--studies 200]   # in-process studies on a replay landscape of identical routes
    python bench/aa.py cpu [--studies 5]        # real `tuner run` studies on no-op knobs, this machine's CPU
    python bench/aa.py cpu --busy               # the same with another process keeping one core busy (part "cpu-busy")
    python bench/aa.py paths [--processes 16]   # one engine against itself in child processes, either way round
                                                # (part "paths-<cap>s", by --timing-cap-s)

*replay*: a landscape where every route is the same engine with realistic measured noise. It is made
from a recorded landscape (bench/landscapes/): the timed rounds of every route that computes the
default route's outputs, each rescaled to the default route's true latency (so a round keeps its
measured deviation from its own route's level), pooled, and given to *every* route. Each study is
what `tuner run` does, through the simulation runner (`bench.landscape.simulate.Simulation`: the
study's sampler, the trial's own child code on the replay backend with paired timing on a virtual
clock, racing, and the end-of-study confirmation `tuner.worker.confirm.judge_study` with its
stopping rule, then the verdict). A study "reports a speedup" when it delivers a route other than
the default. The study's own figure (best vs default as measured in the study, what the
headline was before confirmation) is recorded beside it.

*cpu*: real studies, each a `tuner run` (1 worker, SQLite, real child processes, real ONNX
Runtime timing and the real confirmation) of bench/fixed_cost.py's backend, whose knobs change
nothing: every route runs the same model with the same session options. Then `tuner best --json`.
The timing lock directory is the benchmark's own, so on a machine shared with other jobs its
timings do not queue behind theirs (they are exclusive among the benchmark's own processes only).

*paths*: the two engines of a process reach its timing by different paths (the route's engine is
built or loaded first and gated; the baseline's is loaded for the timing). One engine, stored twice,
is paired with itself in fresh child processes as the confirmation runs them (`make_job`,
`run_isolated`): on the route's path as a trial is, and swapped (`Job.swapped`, the confirmation's
every other process), alternately, `--processes` of each. Each way's offsets are pooled as the
confirmation pools a candidate's processes (`pooled_speedup`), and so are both ways together.

All write their part of the top-level key "aa" of bench/results/measurement.json (other keys of
that file, and the other part, are kept), with the load average and the time beside the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.busy import busy_core  # noqa: E402
from bench.landscape.simulate import Simulation  # noqa: E402
from bench.landscape.truth import Truth  # noqa: E402
from tuner import job as J  # noqa: E402
from tuner.backends.replay.landscape import Landscape, Point, load_landscape  # noqa: E402
from tuner.measure.exclusive import LOCK_DIR_ENV  # noqa: E402
from tuner.spec.model import RunSpec  # noqa: E402
from tuner.study.sampler import sampler_for  # noqa: E402
from tuner.study.summary import summarize_study  # noqa: E402
from tuner.study.verdict import SPEEDUP  # noqa: E402

RESULTS = REPO / "bench" / "results" / "measurement.json"
KEY = "aa"
TARGET = 0.05  # the largest acceptable share of A/A studies that report a speedup
WAYS = ("route-path", "swapped", "alternating")  # the paths part's rows
LANDSCAPES = ("bench/landscapes/efficientnet_lite0.json.gz", "bench/landscapes/minilm_l6.json.gz")


# -- the identical-routes landscape ----------------------------------------------------------------


def identical_landscape(name: str, source: Landscape, truth: Truth) -> tuple[Landscape, dict[str, Any]]:
    """Every route of `source`'s space answered by one pool of rounds of the default route's engine."""
    default = source.point(truth.space.default_route())
    if default is None or default.outputs is None:
        raise SystemExit(f"{name}: the default route has no recorded outputs")
    level = truth.true_value(default)
    pool = []
    for p in source.points:
        true = truth.true_value(p)
        if p.outputs != default.outputs or not true:
            continue
        scale = level / true  # type: ignore[operator]
        pool += [
            replace(r, samples_ms=tuple(s * scale for s in r.samples_ms))
            for r in p.rounds
            if r.status == J.OK and r.timed
        ]
    points = [
        Point(p.route, () if p.invalid else tuple(pool), p.invalid, None if p.invalid else default.outputs)
        for p in source.points
    ]
    medians = np.array([np.median(r.samples_ms) for r in pool])
    about = {
        "source": name,
        "routes": len(points),
        "pool_rounds": len(pool),
        "default_ms": round(float(level), 4),  # type: ignore[arg-type]
        "pool_round_median_cv": round(float(medians.std() / medians.mean()), 4),
        "source_measured": source.meta["environment"].get("loadavg_start"),
        "source_written": source.meta["environment"].get("written"),
    }
    return Landscape(source.meta, points, source.feeds, source.reference, source.outputs), about


def replay_study(truth: Truth, seed: int, trials: int) -> dict[str, Any]:
    """One A/A study as `tuner run` makes it (the simulation runner: the real sampler, trials, racing and
    confirmation)."""
    with tempfile.TemporaryDirectory(prefix="aa-replay-") as tmp:
        sim = Simulation(truth, sampler_for(RunSpec(budget=trials), seed, truth.space), Path(tmp), seed=seed)
        sim.run(trials)
        summary = summarize_study(sim.study)
        delivered = sim.confirmed[max(sim.confirmed)]
    return {
        "seed": seed,
        "trials": len(sim.steps),
        "verdict": SPEEDUP if delivered != sim.default else "default",
        "study_speedup": _r(summary.speedup),
    }  # the study's best vs default: the headline before confirmation


def run_replay(args: argparse.Namespace) -> dict[str, Any]:
    """The replay part: `args.studies` A/A studies on each landscape."""
    load_before, t0 = os.getloadavg(), time.time()
    parts, rows = [], []
    for name in LANDSCAPES:
        source = load_landscape(REPO / name)
        tolerance = float(
            source.meta["accuracy"]["tolerance"]
        )  # the recorded study's; every route has the default's outputs
        landscape, about = identical_landscape(name, source, Truth(source, tolerance))
        truth = Truth(landscape, tolerance)
        these = [replay_study(truth, seed, args.trials) for seed in range(args.studies)]
        print(
            f"{name}: {sum(r['verdict'] == SPEEDUP for r in these)}/{len(these)} studies reported a speedup", flush=True
        )
        parts.append({"landscape": about, **_rates(these), "studies_detail": these})
        rows += these
    return {
        "trials_per_study": args.trials,
        "confirm_top_k": 3,
        "confidence": 0.95,
        "sampler": "sampler_for (the study default)",
        **_rates(rows),
        "machine": _machine(load_before, t0),
        "landscapes": parts,
    }


# -- real CPU studies -------------------------------------------------------------------------------


def _spec(tmp: Path, index: int, args: argparse.Namespace) -> Path:
    from tuner.spec.toml import dumps

    spec = tmp / f"aa-{index}.toml"
    spec.write_text(
        dumps(
            {
                "study": {"name": f"aa-cpu-{index}", "work_dir": str(tmp / f"work-{index}")},
                "model": {"path": str(tmp / "tiny.onnx")},
                "data": {"samples": 4, "gate_samples": 2},
                "accuracy": {"metric": "cosine", "tolerance": 1e-3},
                "objective": {
                    "warmup_s": 0.1,
                    "min_repeats": 20,
                    "min_duration_s": 0.2,
                    "timing_cap_s": args.timing_cap_s,
                },
                "backend": {"name": "bench.fixed_cost:FixedCostBackend", "options": {"build_s": 0.05}},
                "run": {"budget": args.trials, "workers": 1, "seed": index, "trial_timeout_s": 120},
            }
        )
    )
    return spec


def _paths_spec(tmp: Path, args: argparse.Namespace) -> Path:
    """The cpu part's study file on the ONNX Runtime backend whose one free knob changes nothing."""
    from tuner.spec.toml import dumps

    doc = tomllib.loads(_spec(tmp, 0, args).read_text())
    doc["backend"] = {"name": "tests.backends:SameEngineBackend"}
    spec = tmp / "aa-paths.toml"
    spec.write_text(dumps(doc))
    return spec


def _tuner(*argv: str, locks: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), LOCK_DIR_ENV: str(locks)}
    return subprocess.run(
        [sys.executable, "-m", "tuner", *argv], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )


def cpu_study(tmp: Path, index: int, args: argparse.Namespace) -> dict[str, Any]:
    """One real A/A study: `tuner run` with its confirmation, then `tuner best --json`."""
    spec, url = _spec(tmp, index, args), f"sqlite:///{tmp / f'aa-{index}.db'}"
    load_before, t0 = os.getloadavg()[0], time.perf_counter()
    run = _tuner("run", str(spec), "--storage", url, "--confirm-top-k", str(args.top_k), locks=tmp / "locks")
    if run.returncode != 0:
        raise SystemExit(f"study {index}: tuner run failed ({run.returncode}): {run.stderr.strip().splitlines()[-1:]}")
    best = json.loads(_tuner("best", str(spec), "--storage", url, "--json", locks=tmp / "locks").stdout)
    return {
        "seed": index,
        "verdict": best["verdict"],
        "speedup": _r(best["speedup"]),
        "ci": _r(best["speedup_ci"]),
        "study_speedup": _r(best["study_speedup"]),
        "study_speedup_ci": _r(best.get("study_speedup_ci")),
        "wall_s": round(time.perf_counter() - t0, 1),
        "loadavg_1min_before": round(load_before, 2),
        "loadavg_1min_after": round(os.getloadavg()[0], 2),
    }


def run_cpu(args: argparse.Namespace) -> dict[str, Any]:
    """The real part: `args.studies` studies on the no-op space, one after another."""
    from tests.models import conv_model

    load_before, t0 = os.getloadavg(), time.time()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tuner-aa-") as d:
        tmp = Path(d)
        conv_model(tmp / "tiny.onnx")
        for i in range(args.studies):
            rows.append(cpu_study(tmp, i, args))
            r = rows[-1]
            print(
                f"study {i}: {r['verdict']} (study's own estimate {r['study_speedup']}, {r['wall_s']} s, load "
                f"{r['loadavg_1min_after']})",
                flush=True,
            )
    return {
        "backend": "bench.fixed_cost:FixedCostBackend (knobs a, b, c change nothing)",
        "model": "tests.models.conv_model (tiny CNN)",
        "trials_per_study": args.trials,
        "workers": 1,
        "confirm_top_k": args.top_k,
        "timing_cap_s": args.timing_cap_s,
        "timing_lock": "private to this benchmark ($TUNER_LOCK_DIR): its timings were exclusive among its own "
        "processes, not against the other jobs sharing the machine (see loadavg)",
        **_rates(rows),
        "machine": _machine(load_before, t0),
        "studies_detail": rows,
    }


def run_paths(args: argparse.Namespace) -> dict[str, Any]:
    """The paths part: one engine against itself, on the route's path and swapped, in alternate processes."""
    from tests.models import conv_model
    from tuner.spec import load_spec
    from tuner.study.setup import Context
    from tuner.worker.isolate import run_isolated
    from tuner.worker.jobs import make_job

    load_before, t0 = os.getloadavg(), time.time()
    ways: dict[str, list[list[float]]] = {"route-path": [], "swapped": []}
    with tempfile.TemporaryDirectory(prefix="tuner-aa-") as d:
        tmp = Path(d)
        conv_model(tmp / "tiny.onnx")
        spec = _paths_spec(tmp, args)
        objective = tomllib.loads(spec.read_text())["objective"]
        ctx = Context(load_spec(spec), f"sqlite:///{tmp / 'aa.db'}")
        default = ctx.space.default_route()
        other = dict(default, noop="b")  # the same engine under another route
        engines = {}
        for name, route in (("default", default), ("other", other)):
            built = run_isolated(make_job(ctx, route, tmp / name / "out"), tmp / name)
            engines[name] = {"trial": 0, "path": built.artifact_path, "sha256": built.artifact_sha256, "route": route}
        for i in range(args.processes):
            for way, route, baseline in (("route-path", other, "default"), ("swapped", default, "other")):
                job = make_job(ctx, route, tmp / f"{way}-{i}" / "out", baseline=engines[baseline])
                job.swapped = way == "swapped"
                res = run_isolated(job, tmp / f"{way}-{i}")
                if res.status != J.OK or not res.paired.get("paired"):
                    raise SystemExit(f"process {i} ({way}): {res.status}: {res.message}")
                ways[way].append(list(res.paired["log_ratios"]))
            print(f"process {i}: {', '.join(f'{w} {math.exp(statistics.mean(m[-1])):.4f}' for w, m in ways.items())}")
    return {
        "backend": "tests.backends:SameEngineBackend (ONNX Runtime; its knob `noop` changes nothing)",
        "model": "tests.models.conv_model (tiny CNN)",
        "objective": objective,
        "processes_each_way": args.processes,
        **{way: _offsets(m) for way, m in ways.items()},
        "alternating": _offsets([m for pair in zip(*ways.values()) for m in pair]),
        "machine": _machine(load_before, t0),
    }


def _offsets(measurements: list[list[float]]) -> dict[str, Any]:
    """How far one engine timed against itself sits from 1.0: per process and pooled as the confirmation pools."""
    from tuner.measure.speedup import pooled_speedup, speedup_from_log_ratios

    own = [speedup_from_log_ratios(m, 0.95).estimate for m in measurements]
    pooled = pooled_speedup(measurements, 0.95, few=True)
    return {
        "processes": len(measurements),
        "above_1": sum(x > 1.0 for x in own),
        "per_process": _r(own),
        "pooled": _r(pooled.estimate),
        "pooled_ci95": _r([pooled.low, pooled.high]),
    }


# -- figures and the results file -------------------------------------------------------------------


def _rates(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    wins = sum(r["verdict"] == SPEEDUP for r in rows)
    study = [r["study_speedup"] for r in rows if r["study_speedup"] is not None]
    verdicts: dict[str, int] = {}
    for r in rows:
        verdicts[r["verdict"]] = verdicts.get(r["verdict"], 0) + 1
    return {
        "studies": n,
        "reported_speedup": wins,
        "false_win_rate": round(wins / n, 4),
        "false_win_rate_ci95": _wilson(wins, n),
        "target": TARGET,
        "met": wins / n <= TARGET,
        "verdicts": verdicts,
        "study_estimate_above_1": sum(s > 1.0 for s in study),
        "study_estimate_above_1_05": sum(s > 1.05 for s in study),
        "study_estimate_median": round(statistics.median(study), 4) if study else None,
        "study_estimate_max": round(max(study), 4) if study else None,
        "study_interval_above_1": sum(
            1 for r in rows if (r.get("study_speedup_ci") or [0.0])[0] > 1.0
        ),  # paired trials only
    }


def _r(value: Any) -> Any:
    """Floats (also inside a list) to 4 decimals for the results file."""
    if isinstance(value, list):
        return [_r(v) for v in value]
    return round(value, 4) if isinstance(value, float) else value


def _wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    """Wilson score interval of the share k/n."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def _machine(load_before: tuple[float, float, float], t0: float) -> dict[str, Any]:
    return {
        "loadavg_before": [round(v, 2) for v in load_before],
        "loadavg_after": [round(v, 2) for v in os.getloadavg()],
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "started": _utc(t0),
        "finished": _utc(time.time()),
        "wall_s": round(time.time() - t0, 1),
    }


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def write_part(part: str, doc: dict[str, Any], path: Path = RESULTS) -> None:
    """Merge `doc` as results[KEY][part] into the results file (atomically), keeping every other key."""
    results = json.loads(path.read_text()) if path.exists() else {}
    section = dict(results.get(KEY) or {})
    section[part] = doc
    section["note"] = (
        "A/A: every route is the same engine; a study 'reports a speedup' when its verdict "
        "(tuner.study.verdict, after the end-of-study confirmation) is 'speedup'. Target: <= 5 % of studies."
    )
    results[KEY] = section
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(results, indent=1, default=str) + "\n")  # the format bench/measurement.py writes
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(prog="python bench/aa.py", description=__doc__.split("\n\n")[0])
    p.add_argument("part", choices=("replay", "cpu", "paths"))
    p.add_argument("--processes", type=int, default=16, help="paths: processes each way")
    p.add_argument("--studies", type=int, default=None, help="studies (default: 200 per landscape replay, 5 cpu)")
    p.add_argument("--trials", type=int, default=None, help="trial budget per study (default: 20 replay, 6 cpu)")
    p.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="candidates confirmed (default: 3 replay, as `tuner run`; 1 cpu, to stay short)",
    )
    p.add_argument(
        "--timing-cap-s",
        type=float,
        default=3.0,
        help="cpu: each trial's timing cap (the study file's objective.timing_cap_s)",
    )
    p.add_argument(
        "--busy", action="store_true", help="cpu: keep one core busy with another process throughout (bench/busy.py)"
    )
    p.add_argument(
        "--out", type=Path, default=RESULTS, help="the results file (default: bench/results/measurement.json)"
    )
    args = p.parse_args(argv)
    replay_part = args.part == "replay"
    args.studies = args.studies or (200 if replay_part else 5)
    args.trials = args.trials or (20 if replay_part else 6)
    args.top_k = args.top_k or (3 if replay_part else 1)
    part = args.part + ("-busy" if args.busy and not replay_part else "")
    if args.part == "paths":
        doc = run_paths(args)
        write_part(f"paths-{args.timing_cap_s:g}s", doc, args.out)
        rows = [f"{w} {doc[w]['pooled']}x {doc[w]['pooled_ci95']} ({doc[w]['above_1']} above 1)" for w in WAYS]
        print("paths: pooled offsets " + ", ".join(rows))
        return 0
    if replay_part:
        doc = run_replay(args)
    else:
        with busy_core() if args.busy else contextlib.nullcontext() as busy:
            doc = {**run_cpu(args), **({"busy": busy.describe()} if busy else {})}
    write_part(part, doc, args.out)
    print(
        f"{part}: {doc['reported_speedup']}/{doc['studies']} A/A studies reported a speedup "
        f"({doc['false_win_rate']:.1%}, 95% CI "
        f"{doc['false_win_rate_ci95'][0]:.1%}-{doc['false_win_rate_ci95'][1]:.1%}; target <= {TARGET:.0%}); the "
        f"study's own estimate was above 1.0 in {doc['study_estimate_above_1']} (max {doc['study_estimate_max']}x)"
    )
    return 0 if doc["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
