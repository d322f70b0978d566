"""H200 agreement: an Inductor study's paired speedup against a side-by-side re-measurement of the same two engines.

One device call (bench/gpu/run_study.sh installs the wheels; this driver replaces its study step):

1. a fresh study (embedded SQLite) with a known-good candidate enqueued right after the baseline
   (`--enqueue`: route fields over the default route), so a short budget still has a winner;
2. `tuner run SPEC --gpus 0 --trials N --no-confirm` with racing off (device time is scarce);
3. the trials (paired speedup, interval, stopping reason, timing facts, baseline reload cost);
4. `inductor_study.side_by_side`: default and winner compiled again in one process (warm cache),
   timed in interleaved rounds (the method of the earlier 4.28x reference measurement), and once more paired
   (ABBA, the trial's own method), with each engine's block-level drift beside the per-cycle ratios.

`agreement` = the study's paired speedup of the winner / the side-by-side median speedup.

Usage: python -m bench.gpu.measure_agreement --out OUT.json [--trials 3] [--rounds 6] [--timeout 300] SPEC
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench.gpu.inductor_study import REPO, collect, environment, run_bounded, side_by_side, write

WINNER = {
    "mode": "reduce-overhead",
    "precision": "fp16",
    "channels_last": True,
    "freezing": True,
}  # the winner of earlier H200 runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument(
        "--enqueue",
        type=json.loads,
        default=WINNER,
        help="route fields (JSON) of a candidate enqueued after the baseline",
    )
    args = p.parse_args()
    doc: dict[str, Any] = {"environment": environment()}
    write(args.out, doc)
    try:
        doc.update(study(args))
        write(args.out, doc)
        doc["side_by_side"] = side_by_side(args.spec, doc["storage"], args.rounds)
        doc["agreement"] = agreement(doc)
    except Exception as exc:  # keep what was measured: device time is scarce
        import traceback

        doc["error"] = f"{type(exc).__name__}: {exc}"
        doc["traceback"] = traceback.format_exc()[-3000:]
    write(args.out, doc)
    print(json.dumps({k: doc.get(k) for k in ("agreement", "error", "run_wall_s")}, indent=1, default=str))


def study(args: argparse.Namespace) -> dict[str, Any]:
    """Prepare the study with the enqueued candidate, run it, and collect the trials with their paired attributes."""
    from tuner.spec import load_spec
    from tuner.study import attrs as A
    from tuner.study.setup import Context, prepare

    spec = load_spec(args.spec)
    shutil.rmtree(spec.work_dir, ignore_errors=True)
    spec.work_dir.mkdir(parents=True)
    storage = f"sqlite:///{spec.work_dir / 'study.db'}"
    ctx = Context(spec, storage)
    route = {**ctx.space.default_route(), **args.enqueue}
    prepare(ctx).enqueue_trial(route, user_attrs={A.SOURCE: "bench"})
    racing_off = args.spec.with_name(f".{args.spec.stem}-norace.toml")
    racing_off.write_text(args.spec.read_text().replace("[run]\n", "[run]\nracing = false\n"))
    cmd = [
        sys.executable,
        "-m",
        "tuner",
        "run",
        str(racing_off),
        "--storage",
        storage,
        "--gpus",
        "0",
        "--no-confirm",
        "--trials",
        str(args.trials),
    ]
    t0 = time.time()
    with open(args.out.parent / f"{spec.study}-measure.log", "w") as log:
        rc = run_bounded(cmd, log, args.timeout)
    wall = time.time() - t0
    out = {
        "storage": storage,
        "returncode": rc,
        "run_wall_s": round(wall, 1),
        "enqueued": route,
        **collect(spec, storage, wall),
    }
    study = ctx.load()
    for t, row in zip(sorted(study.get_trials(deepcopy=False), key=lambda t: t.number), out["trials"]):
        row.update(
            {
                k: t.user_attrs.get(k)
                for k in (
                    "paired",
                    "speedup_paired",
                    "speedup_paired_ci",
                    "timing_stop",
                    "timing",
                    "baseline_latency_ms",
                    "phase_s",
                    "unpaired",
                )
            }
        )
    return out


def agreement(doc: dict[str, Any]) -> dict[str, Any]:
    """The study's paired speedup for the side-by-side winner against the side-by-side speedups."""
    sbs = doc.get("side_by_side") or {}
    if "speedup" not in sbs:
        return {"skipped": sbs.get("skipped", "no side-by-side measurement")}
    best = doc["summary"].get("best_trial")
    row = next((t for t in doc["trials"] if t["number"] == best), {})
    study_speedup = row.get("speedup_paired")
    rounds, paired = sbs["speedup"]["median"], (sbs.get("paired") or {}).get("speedup")
    return {
        "winner_trial": best,
        "study_speedup": study_speedup,
        "study_ci": row.get("speedup_paired_ci"),
        "side_by_side_rounds_speedup": rounds,
        "side_by_side_paired_speedup": paired,
        "study_vs_rounds": study_speedup / rounds if study_speedup and rounds else None,
        "study_vs_paired": study_speedup / paired if study_speedup and paired else None,
        "winner_between_round_cv": sbs.get("winner", {}).get("cv_between_rounds"),
        "default_between_round_cv": sbs.get("default", {}).get("cv_between_rounds"),
    }


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
