#!/usr/bin/env bash
# The multi-shape Inductor study on a GPU machine, confirmation included: install the carried wheels
# (.whl/, as bench/gpu/run_study.sh does), run studies/efficientnet_lite0_inductor_shapes.toml on a
# fresh embedded database, then record `tuner best --json`, the GPU's state before and after, the
# load average and the wall time in $OUT/gpu-inductor-shapes.json (default bench/results). Extra
# arguments go to `tuner run` (e.g. `--trials 4 --confirm-top-k 2`).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-bench/results}"
SPEC=studies/efficientnet_lite0_inductor_shapes.toml
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
  export PYTHONPATH="${PWD}/.site:${PWD}${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="${PWD}${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
rm -rf studies/.tuner/efficientnet-lite0-inductor-shapes
gpu() { nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu,memory.used --format=csv,noheader; }
before=$(gpu); load_before=$(cut -d' ' -f1-3 /proc/loadavg); t0=$(date +%s.%N)
python3 -m tuner run "$SPEC" "$@" 2>&1 | tee "$OUT/gpu-inductor-shapes.log"
wall=$(python3 -c "import time; print(round(time.time() - $t0, 1))")
python3 -m tuner best "$SPEC" --json > "$OUT/.best.json"
python3 - "$OUT" "$wall" "$before" "$(gpu)" "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY'
import json, sys, time
out, wall, before, after, lb, la = sys.argv[1:]
doc = {
    "benchmark": "gpu-inductor-shapes",
    "spec": "studies/efficientnet_lite0_inductor_shapes.toml",
    "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "wall_s": float(wall),
    "gpu_before": before,
    "gpu_after": after,
    "load_average_before": [float(x) for x in lb.split()],
    "load_average_after": [float(x) for x in la.split()],
    "best": json.load(open(f"{out}/.best.json")),
}
open(f"{out}/gpu-inductor-shapes.json", "w").write(json.dumps(doc, indent=1))
PY
rm -f "$OUT/.best.json"
