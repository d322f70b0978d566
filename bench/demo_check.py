"""What `make demo` ends with, recorded: the bundled study run with its own budget, then its verdict.

Runs `tuner run SPEC` (the study's own budget, confirmation included) and `tuner best SPEC --json`,
and writes the verdict, the confirmed speedup with its interval, the winning route, the wall time, the
confirmation's share of it (`confirm_s`, from the confirmation's own record), the tuner's own seconds
per trial (`overhead_s`: median, largest, total) and the load average before and after to
bench/results/demo.json (`--out` elsewhere).

Usage: python bench/demo_check.py [--spec studies/efficientnet_lite0.toml] [--storage URL]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def tuner_overhead(spec_path: str, storage: str | None) -> dict[str, float]:
    """The tuner's own seconds per trial (`overhead_s`: a trial's wall time outside its child's phases,
    proposing the route included): median, largest and total over the study's trials."""
    import optuna

    from tuner.spec import load_spec
    from tuner.spec.load import resolve_storage
    from tuner.study import attrs as A

    spec = load_spec(Path(spec_path))
    study = optuna.load_study(study_name=spec.study, storage=resolve_storage(spec, storage))
    values = [float(t.user_attrs[A.OVERHEAD_S]) for t in study.trials if A.OVERHEAD_S in t.user_attrs]
    if not values:
        return {}
    return {
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
        "total": round(sum(values), 1),
    }


def cpu() -> dict[str, object]:
    """The processor the figures were measured on: its model, cores and whether it has VNNI (int8 dot products,
    which decide how much the int8 routes gain)."""
    from tuner.backends.device import cpu_fingerprint
    from tuner.backends.onnxruntime.quant_space import cpu_flags

    host = cpu_fingerprint()
    return {"model": host["cpu"], "cores": host["cores"], "vnni": bool(cpu_flags() & {"avx512_vnni", "avx_vnni"})}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--spec", default=str(REPO / "studies" / "efficientnet_lite0.toml"))
    p.add_argument("--storage", default=None)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "demo.json")
    p.add_argument("--trials", type=int, default=None, help="a budget other than the study's (a dry run)")
    args = p.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    storage = ["--storage", args.storage] if args.storage else []
    load_before, t0 = os.getloadavg(), time.time()
    trials = ["--trials", str(args.trials)] if args.trials else []
    subprocess.run([sys.executable, "-m", "tuner", "run", args.spec, *storage, *trials], check=True, cwd=REPO, env=env)
    wall = time.time() - t0
    best = subprocess.run(
        [sys.executable, "-m", "tuner", "best", args.spec, *storage, "--json"],
        check=True,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    doc = json.loads(best.stdout)
    result = {
        "benchmark": "demo",
        "spec": Path(args.spec).name,
        "verdict": doc.get("verdict"),
        "headline": doc.get("headline"),
        "speedup": doc.get("speedup"),
        "speedup_ci": doc.get("speedup_ci"),
        "trial": doc.get("trial"),
        "route": doc.get("route"),
        "study_speedup": doc.get("study_speedup"),
        "wall_s": round(wall, 1),
        "confirm_s": (doc.get("confirmation") or {}).get("seconds"),
        "confirm_rounds": (doc.get("confirmation") or {}).get("rounds"),
        "contention": (doc.get("confirmation") or {}).get("contention"),
        "trials": args.trials,
        "cpu": cpu(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    result["confirm_share"] = round(result["confirm_s"] / result["wall_s"], 3) if result["confirm_s"] and wall else None
    result["overhead_s"] = tuner_overhead(args.spec, args.storage)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
