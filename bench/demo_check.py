"""What `make demo` ends with, recorded: the bundled study run with its own budget, then its verdict.

Runs `tuner run SPEC` (the study's own budget, confirmation included) and `tuner best SPEC --json`,
and writes the verdict, the confirmed speedup with its interval, the winning route, the wall time and
the load average before and after to bench/results/demo.json.

Usage: python bench/demo_check.py [--spec studies/efficientnet_lite0.toml] [--storage URL]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--spec", default=str(REPO / "studies" / "efficientnet_lite0.toml"))
    p.add_argument("--storage", default=None)
    args = p.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    storage = ["--storage", args.storage] if args.storage else []
    load_before, t0 = os.getloadavg(), time.time()
    subprocess.run([sys.executable, "-m", "tuner", "run", args.spec, *storage], check=True, cwd=REPO, env=env)
    wall = time.time() - t0
    best = subprocess.run([sys.executable, "-m", "tuner", "best", args.spec, *storage, "--json"], check=True, cwd=REPO, env=env,
                          capture_output=True, text=True)
    doc = json.loads(best.stdout)
    result = {
        "benchmark": "demo", "spec": Path(args.spec).name, "verdict": doc.get("verdict"), "headline": doc.get("headline"),
        "speedup": doc.get("speedup"), "speedup_ci": doc.get("speedup_ci"), "trial": doc.get("trial"), "route": doc.get("route"),
        "study_speedup": doc.get("study_speedup"), "wall_s": round(wall, 1),
        "load_average_before": [round(x, 2) for x in load_before], "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out = REPO / "bench" / "results" / "demo.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
