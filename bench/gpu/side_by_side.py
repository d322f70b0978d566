"""One GPU study run with this tree's tuner and with another tree's, one right after the other, end to end.

    python -m bench.gpu.side_by_side --other TREE --workers 4 --trials 12 --pairs 1 [--first-pair 0] --out OUT.json

Each run is a fresh study (fresh work dir, SQLite database, Inductor and Triton caches) of the GPU landscape's
EfficientNet-Lite0 study (`studies/efficientnet_lite0_inductor_landscape.toml`: model, data, timing,
the stated 64-route subset) with plain Inductor, the bundled study's tolerance, the random sampler
(no learning to differ between the two trees) and racing off, run by `tuner run SPEC --gpus 0,...,0 --trials T
--no-confirm`: W workers on the one GPU, compiling in parallel on the host's cores and timing one at a
time. A pair is one run of each tree; which goes first alternates between pairs. Recorded per run:
the command's wall time from start to end, every trial's start, end, phases and outcome, and the
machine's state before and after (load average, GPU clocks and temperature from `nvidia-smi`). The
other tree is a checkout of another commit (`git archive REV tuner migrations | tar -x -C TREE`); the
carried wheels (`bench/gpu/run_study.sh`) must be installed in /tmp/site. The JSON document is
rewritten after every run, so a run cut short keeps what it did.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SPACE = {  # the GPU landscape's stated subset (studies/efficientnet_lite0_inductor_landscape.toml)
    "mode": ["default", "reduce-overhead"],
    "precision": ["fp32", "tf32", "bf16", "fp16"],
    "channels_last": [False, True],
    "freezing": [False, True],
    "epilogue_fusion": [True, False],
    "aggressive_fusion": [False],
    "max_fusion_size": [64],
    "pattern_matcher": [True],
    "coordinate_descent_tuning": [False],
    "layout_optimization": [True],
}


def spec_text(work: Path, trials: int) -> str:
    """The GPU landscape's EfficientNet-Lite0 study (model, data, accuracy, timing, space) with plain Inductor, in
    `work`, random sampler, no racing."""
    from tuner.spec.toml import dumps

    models = REPO / "models"
    return dumps(
        {
            "study": {"name": "side-by-side", "work_dir": str(work)},
            "model": {
                "path": str(models / "efficientnet_lite0.onnx"),
                "inputs": {"images": {"shape": [1, 3, 224, 224]}},
            },
            "data": {"file": str(models / "efficientnet_lite0_val.npz"), "samples": 16, "gate_samples": 4},
            "accuracy": {"metric": "top1_mismatch", "tolerance": 0.125},
            "objective": {
                "statistic": "median",
                "min_repeats": 50,
                "warmup_s": 0.2,
                "min_duration_s": 0.6,
                "timing_cap_s": 5.0,
                "target_halfwidth": 0.02,
            },
            "backend": {"name": "inductor", "options": {"device": "cuda"}, "space": SPACE},
            "run": {"budget": trials, "trial_timeout_s": 300, "racing": False, "sampler": "random"},
        }
    )


def machine_state() -> dict[str, Any]:
    """Load average and the GPU's clocks, temperature and use now."""
    query = "name,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu,pstate"
    smi = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout.strip()
    return {"loadavg": [round(v, 2) for v in os.getloadavg()], "gpu": smi, "query": query}


def run_once(tree: Path, work: Path, workers: int, trials: int, timeout_s: float) -> dict[str, Any]:
    """One fresh study with `tree`'s tuner, end to end."""
    import optuna

    from tuner.study import attrs as A

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    spec = work / "study.toml"
    spec.write_text(spec_text(work, trials))
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env.update(PYTHONPATH=f"/tmp/site:{tree}", TRITON_CACHE_DIR=str(work / "triton-cache"))  # no kernel reused
    storage = f"sqlite:///{work / 'study.db'}"
    cmd = [sys.executable, "-m", "tuner", "run", str(spec), "--storage", storage, "--no-confirm"]
    cmd += ["--gpus", ",".join(["0"] * workers)]
    before = machine_state()
    t0 = time.perf_counter()
    with open(work / "run.log", "w") as log:
        try:
            rc: int | str = subprocess.run(
                cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s
            ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.perf_counter() - t0
    after = machine_state()
    ts = optuna.load_study(study_name="side-by-side", storage=storage).get_trials(deepcopy=False)
    started = [t.datetime_start for t in ts if t.datetime_start]
    t_first = min(started) if started else None
    return {
        "returncode": rc,
        "wall_s": round(wall, 2),
        "before": before,
        "after": after,
        "log_tail": (work / "run.log").read_text()[-1500:],
        "trials": [
            {
                "number": t.number,
                "state": t.state.name,
                "failure_class": t.user_attrs.get(A.FAILURE_CLASS, ""),
                "start_s": round((t.datetime_start - t_first).total_seconds(), 2) if t.datetime_start else None,
                "end_s": round((t.datetime_complete - t_first).total_seconds(), 2) if t.datetime_complete else None,
                "phase_s": {k: round(v, 2) for k, v in (t.user_attrs.get(A.PHASE_S) or {}).items()},
                "paired": t.user_attrs.get(A.PAIRED),
            }
            for t in sorted(ts, key=lambda t: t.number)
        ],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--other", type=Path, required=True, help="the other tree (a checkout of another commit)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--pairs", type=int, default=1)
    p.add_argument("--first-pair", type=int, default=0, help="the first pair's index (its parity picks the order)")
    p.add_argument("--timeout", type=float, default=280.0, help="seconds allowed for each `tuner run`")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    trees = {"now": REPO, "other": args.other.resolve()}
    doc: dict[str, Any] = {"workers": args.workers, "trials": args.trials, "method": __doc__, "runs": []}
    for pair in range(args.first_pair, args.first_pair + args.pairs):
        for label in ("now", "other") if pair % 2 == 0 else ("other", "now"):
            work = Path("/tmp/side-by-side") / f"{label}-{pair}"
            run = run_once(trees[label], work, args.workers, args.trials, args.timeout)
            doc["runs"].append({"tree": label, "pair": pair, **run})
            args.out.write_text(json.dumps(doc, indent=1))
            print(f"pair {pair} {label}: {run['wall_s']} s, rc {run['returncode']}", flush=True)


if __name__ == "__main__":
    main()
