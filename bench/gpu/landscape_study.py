"""GPU landscape and GPU throughput on one H200, from real studies (bench/gpu/run_study.sh installs the wheels).

    python -m bench.gpu.landscape_study --out OUT.json --landscape L.json.gz --runs 8:64 4:12 1:4 \
        studies/efficientnet_lite0_inductor_landscape.toml

Each `--runs W:T` entry is one fresh study (fresh work dir, database and Inductor cache) of the study
file run end to end by `tuner run SPEC --gpus 0,...,0 --trials T --no-confirm`: W workers on the one
GPU, compiling in parallel on the host's cores and timing one at a time on the GPU (the per-device
timing lock, `tuner.measure.exclusive`), each trial paired with the default route. Recorded per run:
command wall time, trials per hour from command start to end (and within the trials' own window),
GPU utilisation, and every trial's paired speedup.

The first run whose budget covers the whole (64-route) space also becomes the landscape: every
trial's route, outcome, build time, per-call samples (`tuner_measurements`), paired speedup and the
engine's outputs per feed (the study runs on the capture wrapper) are written as a
`route-tuner-landscape/1` file with one round per route, which `bench/search_efficiency.py` replays.
The JSON document is rewritten after every stage, so a run cut short keeps what it did.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.gpu.inductor_study import environment, run_study, write

FINISHED = ("COMPLETE", "PRUNED", "FAIL")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--landscape", type=Path, default=None, help="write the landscape of the first full run here")
    p.add_argument("--runs", nargs="+", default=["8:64"], help="WORKERS:TRIALS, one fresh study each, in order")
    p.add_argument("--timeout", type=float, default=540.0, help="seconds allowed for each `tuner run`")
    args = p.parse_args()
    doc: dict[str, Any] = {"environment": environment(), "spec": str(args.spec), "runs": []}
    write(args.out, doc)
    for item in args.runs:
        workers, trials = (int(x) for x in item.split(":"))
        entry: dict[str, Any] = {"workers": workers, "trials": trials}
        doc["runs"].append(entry)
        try:
            entry.update(run_study(args.spec, ",".join(["0"] * workers), trials, args.timeout, args.out.parent))
            entry["paired"] = paired_table(entry["trials"])
            if args.landscape is not None and "landscape" not in doc:
                doc["landscape"] = to_landscape(args.spec, entry["storage"], args.landscape)
        except Exception as exc:  # keep what was measured: device time is scarce
            import traceback

            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()[-3000:]
        write(args.out, doc)
    doc["throughput"] = throughput(doc["runs"])
    write(args.out, doc)
    print({k: v for k, v in doc.items() if k not in ("runs", "environment")})


def paired_table(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per finished trial: route, outcome, paired speedup and interval (what the throughput runs agree on)."""
    from tuner.space import route_hash

    out = []
    for t in trials:
        if t["state"] not in FINISHED:
            continue
        out.append(
            {
                "number": t["number"],
                "route": route_hash(t["params"]) if t["params"] else None,
                "state": t["state"],
                "failure_class": t["failure_class"],
                "speedup": t.get("speedup_paired"),
                "ci": t.get("speedup_paired_ci"),
            }
        )
    return out


def throughput(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Trials per hour end to end per worker count, relative to one worker, and the agreement of common routes."""
    rows = {r["workers"]: r for r in runs if r.get("trials_per_hour_wall")}
    one = rows.get(1, {}).get("trials_per_hour_wall")
    table = {
        w: {
            "trials_per_hour_end_to_end": r["trials_per_hour_wall"],
            "trials_per_hour_window": r.get("trials_per_hour"),
            "vs_1_worker": round(r["trials_per_hour_wall"] / one, 2) if one else None,
            "run_wall_s": r.get("run_wall_s"),
            "gpu": r.get("gpu_samples"),
        }
        for w, r in sorted(rows.items())
    }
    speedups: dict[str, dict[int, float]] = {}
    for w, r in rows.items():
        for t in r.get("paired", []):
            if t["route"] and t["speedup"]:
                speedups.setdefault(t["route"], {})[w] = t["speedup"]
    common = {k: v for k, v in speedups.items() if len(v) > 1}
    spread = [max(v.values()) / min(v.values()) - 1 for v in common.values()]
    return {
        "by_workers": table,
        "routes_measured_in_several_runs": len(common),
        "paired_speedup_spread_across_runs": {"median": statistics.median(spread), "max": max(spread)}
        if spread
        else None,
    }


def to_landscape(spec_path: Path, storage: str, out: Path) -> dict[str, Any]:
    """The study's trials as a landscape file (one round per route); returns a summary of what it holds."""
    from bench.landscape.record import Recorder, _ordered
    from tuner import job as J
    from tuner.backends.replay.capture import captured_path, read_captured
    from tuner.backends.replay.landscape import feed_key, outputs_key
    from tuner.space import route_hash
    from tuner.store.cache import ResultStore
    from tuner.study import attrs as A
    from tuner.study.setup import Context

    rec = Recorder(spec_path, out, rounds=1)
    ctx = rec.ctx
    study = Context(ctx.spec, storage).load()
    samples = {m.trial_number: m.samples_ms for m in ResultStore(storage).measurements(ctx.spec.study, kind="trial")}
    feeds = [feed_key(f) for f in ctx.feeds]
    done: dict[str, dict[int, dict[str, Any]]] = {}
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        status = t.user_attrs.get(A.FAILURE_CLASS) or (J.OK if t.state.name == "COMPLETE" else "")
        if t.state.name not in FINISHED or status in (J.LOST, J.INTERRUPTED, "") or not t.params:
            continue
        key = route_hash(t.params)
        if key in done:
            continue
        timing = t.user_attrs.get(A.TIMING) or {}
        entry: dict[str, Any] = {
            "key": key,
            "round": 0,
            "route": dict(t.params),
            "status": status,
            "phase": "",
            "message": str(t.user_attrs.get(A.MESSAGE, ""))[:500],
            "build_s": t.user_attrs.get(A.BUILD_S),
            "samples_ms": [round(s, 5) for s in samples.get(t.number, [])],
            "accuracy": _finite((t.user_attrs.get(A.ACCURACY) or {}).get("value")),
            "speedup_paired": t.user_attrs.get(A.SPEEDUP_PAIRED),
            "speedup_paired_ci": t.user_attrs.get(A.SPEEDUP_PAIRED_CI),
            "t": t.datetime_complete.timestamp() if t.datetime_complete else 0.0,
            "load1": _first(timing.get("loadavg_before")),
        }
        captured = captured_path(ctx.work_dir, t.params)
        if status == J.OK and captured.exists():
            outputs = _ordered(read_captured(captured), feeds)
            okey = outputs_key(outputs)
            path = rec.dir / "outputs" / f"{okey}.npz"
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, **{f"{i}/{n}": a for i, o in enumerate(outputs) for n, a in o.items()})
            entry["outputs"] = okey
        done[key] = {0: entry}
    landscape = rec.landscape(done)
    landscape.save(out)
    statuses: dict[str, int] = {}
    for rounds in done.values():
        statuses[rounds[0]["status"]] = statuses.get(rounds[0]["status"], 0) + 1
    return {
        "file": str(out),
        "routes_in_space": rec.total,
        "routes_recorded": len(done),
        "outcomes": statuses,
        "with_outputs": sum("outputs" in r[0] for r in done.values()),
    }


def _first(v: Any) -> float:
    """The 1-minute load average from a recorded load figure (a number or the os.getloadavg triple)."""
    if isinstance(v, list | tuple):
        v = v[0] if v else None
    return float(v) if isinstance(v, int | float) else math.nan


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


if __name__ == "__main__":
    sys.exit(main())
