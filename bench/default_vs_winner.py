"""Default route vs the study's winner, side by side in one run, plus the tuner's own overhead per trial.

Runs (or resumes) the bundled study, then re-measures the default route and the best feasible route
interleaved, each run in a fresh process (the confirmation procedure of `tuner run`), and reads the
per-trial overhead (trial wall time not spent inside the child's build/check/time phases) from the
study. Writes bench/results/default-vs-winner.json.

Usage: python bench/default_vs_winner.py [--spec studies/efficientnet_lite0.toml] [--storage URL] [--rounds 12]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tuner.spec import load_spec, resolve_storage  # noqa: E402
from tuner.study import attrs as A  # noqa: E402
from tuner.study.setup import Context  # noqa: E402
from tuner.worker.confirm import confirm  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--spec", default=str(REPO / "studies" / "efficientnet_lite0.toml"))
    p.add_argument("--storage", default=None)
    p.add_argument("--rounds", type=int, default=12)
    args = p.parse_args()
    spec = load_spec(args.spec)
    ctx = Context(spec, resolve_storage(spec, args.storage))
    run = [sys.executable, "-m", "tuner", "run", args.spec, "--no-confirm"] + (
        ["--storage", ctx.url] if args.storage else []
    )
    subprocess.run(run, check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    study = ctx.load()
    doc = confirm(ctx, study, rounds=args.rounds, top_k=1)
    trials = [
        t
        for t in study.get_trials(deepcopy=False)
        if A.OVERHEAD_S in t.user_attrs and not t.user_attrs.get(A.CACHE_HIT)
    ]
    overhead = [t.user_attrs[A.OVERHEAD_S] for t in trials]
    wall = [t.user_attrs[A.TRIAL_WALL_S] for t in trials]
    cand = doc["candidates"][0] if doc.get("candidates") else {}
    result = {
        "benchmark": "default-vs-winner",
        "study": spec.study,
        "model": spec.model.path.name,
        "rounds": doc.get("rounds"),
        "statistic": spec.objective.statistic,
        "default_ms": doc.get("default_median_ms"),
        "winner_ms": cand.get("median_ms"),
        "winner_trial": cand.get("trial"),
        "winner_route": cand.get("route"),
        "speedup": doc.get("speedup"),
        "ci95": doc.get("ci"),
        "verdict": doc.get("verdict"),
        "message": doc.get("message"),
        "overhead_s_per_trial_median": round(statistics.median(overhead), 3) if overhead else None,
        "trial_wall_s_median": round(statistics.median(wall), 3) if wall else None,
        "overhead_fraction": round(sum(overhead) / sum(wall), 3) if wall else None,
        "trials_measured": len(trials),
        "load_average": os.getloadavg()[0],
    }
    out = REPO / "bench" / "results" / "default-vs-winner.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
