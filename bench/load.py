"""A study on a quiet host and on a busy one, side by side: wall time, trials reached, verdict, and agreement.

For each scenario, `--pairs` times, alternating which goes first: the study run quiet, and the same
study run while another process keeps one core busy (`bench/busy.py`). Each run is a real
`tuner run SPEC --trials N` (its confirmation included) on a fresh SQLite storage and work dir, then
`tuner best --json`. After a loaded run, its best route is measured again against the default on
the quiet host, side by side: the real confirmation's processes (`tuner.worker.confirm.Session`,
each timing both engines paired in ABBA blocks in a fresh process) pooled by random effects. What
the loaded study reported (its confirmed speedup, or its own estimate) is set against that quiet
figure (`agreement`: the ratio, and whether it reported faster a route the quiet side-by-side
shows slower).

Scenarios:
- `bundled`: studies/efficientnet_lite0.toml (the bundled study, EfficientNet-Lite0, ONNX Runtime CPU);
- `ocr`: the PP-OCRv4 text recogniser shipped in the `rapidocr-onnxruntime` wheel (downloaded from
  PyPI with pip at bench time, the wheel only, no dependencies), input [1, 3, 48, 320], 24 text lines
  rendered with Pillow's default font and normalised as PP-OCR does; accuracy: cosine of the
  per-position class probabilities, tolerance 0.01.

Writes bench/results/load.json (`--out`): per scenario the runs, `quiet_wall_s` and `loaded_wall_s`
(medians over the pairs), when it started and finished, and the machine's load average around each run;
scenarios not run this time keep their earlier entries.

Usage: python bench/load.py [--scenario bundled ocr] [--pairs 1] [--trials N] [--side-by-side 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.busy import busy_core  # noqa: E402
from bench.landscape.models import fetch  # noqa: E402
from tuner.spec.toml import dumps  # noqa: E402

OUT = REPO / "bench" / "results" / "load.json"
OCR_LINES = [
    "Route Tuner 2026",
    "invoice no. 48213",
    "total 1,299.00 EUR",
    "Bahnhofstrasse 12",
    "ORDER CONFIRMED",
    "tel +41 44 123 45 67",
    "shipped 2026-11-30",
    "qty 3 x 19.90",
    "thank you!",
    "batch B-7781",
    "page 2 of 5",
    "due date 15.12.2026",
    "ref ABX-0042-Q",
    "net weight 2.5 kg",
    "Zurich HB 08:15",
    "serial 00A3-77F1",
    "VAT 8.1 %",
    "gate 14 / seat 22C",
    "lot 2026/11/04",
    "exp 05/28",
    "room 3.14",
    "km 128.6",
    "user: admin",
    "OK 200",
]


def _tuner(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner", *argv], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )


def bundled_spec(tmp: Path, name: str) -> Path:
    """The bundled study file, with its own study name and work dir."""
    import tomllib

    src = REPO / "studies" / "efficientnet_lite0.toml"
    doc = tomllib.loads(src.read_text())
    for section, key in (("model", "path"), ("data", "file")):
        doc[section][key] = str((src.parent / doc[section][key]).resolve())
    doc["study"] = {"name": name, "work_dir": str(tmp / name)}
    path = tmp / f"{name}.toml"
    path.write_text(dumps(doc))
    return path


def ocr_inputs(tmp: Path) -> tuple[Path, Path]:
    """The PP-OCRv4 recogniser from its PyPI wheel (`bench.landscape.models.fetch`), and 24 rendered text lines as its
    validation data (once per run)."""
    import numpy as np
    from PIL import Image, ImageDraw

    model, data = fetch("ppocrv4_rec.onnx"), tmp / "ppocrv4_lines.npz"
    lines = []
    for text in OCR_LINES:
        img = Image.new("RGB", (320, 48), "white")
        ImageDraw.Draw(img).text((6, 16), text, fill="black")
        lines.append(
            (np.asarray(img, dtype=np.float32).transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
        )  # PP-OCR's normalisation
    np.savez(data, x=np.stack(lines))
    return model, data


def ocr_spec(tmp: Path, name: str) -> Path:
    model, data = ocr_inputs(tmp)
    path = tmp / f"{name}.toml"
    path.write_text(
        dumps(
            {
                "study": {"name": name, "work_dir": str(tmp / name)},
                "model": {"path": str(model), "inputs": {"x": {"shape": [1, 3, 48, 320]}}},
                "data": {"file": str(data), "samples": len(OCR_LINES), "gate_samples": 4},
                "accuracy": {"metric": "cosine", "tolerance": 0.01},
                "objective": {"statistic": "median", "warmup_s": 0.2, "min_repeats": 20, "min_duration_s": 0.5},
                "backend": {"name": "onnxruntime"},
                "run": {"budget": 20, "workers": 1, "trial_timeout_s": 300},
            }
        )
    )
    return path


SCENARIOS = {"bundled": bundled_spec, "ocr": ocr_spec}


def side_by_side(spec: Path, url: str, trial: int, processes: int) -> dict[str, Any]:
    """Trial `trial` against the default, quiet: `processes` confirmation processes, pooled."""
    import optuna

    from tuner.measure.speedup import pooled_speedup
    from tuner.spec import load_spec
    from tuner.study.setup import Context
    from tuner.study.summary import summarize_study
    from tuner.worker.confirm import Session

    ctx = Context(load_spec(spec), url)
    study = optuna.load_study(study_name=ctx.spec.study, storage=url)
    baseline = summarize_study(study).baseline
    chosen = next(t for t in study.get_trials(deepcopy=False) if t.number == trial)
    ratios = []
    with Session(ctx, baseline) as session:  # type: ignore[arg-type]
        for r in range(processes):
            res = session.measure(chosen, r)
            if res.paired.get("log_ratios") and not res.paired.get("contended"):
                ratios.append(res.paired["log_ratios"])
    s = pooled_speedup(ratios, 0.95) if ratios else None
    return {
        "trial": trial,
        "processes": len(ratios),
        "speedup": s.estimate if s else None,
        "ci": [s.low, s.high] if s else None,
    }


def one_run(
    scenario: str, tmp: Path, index: int, loaded: bool, trials: int | None, env: dict[str, str]
) -> dict[str, Any]:
    name = f"load-{scenario}-{index}-{'loaded' if loaded else 'quiet'}"
    spec, url = SCENARIOS[scenario](tmp, name), f"sqlite:///{tmp / f'{name}.db'}"
    before, t0 = os.getloadavg(), time.monotonic()
    with busy_core() if loaded else contextlib.nullcontext() as busy:
        run = _tuner("run", str(spec), "--storage", url, *(["--trials", str(trials)] if trials else []), env=env)
        wall = time.monotonic() - t0
        described = busy.describe() if busy else None
    if run.returncode != 0:
        raise SystemExit(f"{name}: tuner run failed ({run.returncode}): {run.stderr.strip().splitlines()[-3:]}")
    best = json.loads(_tuner("best", str(spec), "--storage", url, "--json", env=env).stdout)
    status = json.loads(_tuner("status", str(spec), "--storage", url, "--json", env=env).stdout)
    conf = best.get("confirmation") or {}
    return {
        "scenario": scenario,
        "loaded": loaded,
        "busy": described,
        "wall_s": round(wall, 1),
        "confirm_s": conf.get("seconds"),
        "trials_reached": status["complete"] + status["pruned"] + status["failed"],
        "verdict": best.get("verdict"),
        "trial": best.get("trial"),
        "speedup": best.get("speedup"),
        "speedup_ci": best.get("speedup_ci"),
        "study_speedup": best.get("study_speedup"),
        "contention": conf.get("contention"),
        "confirm_rounds": conf.get("rounds"),
        "loadavg_before": [round(v, 2) for v in before],
        "loadavg_after": [round(v, 2) for v in os.getloadavg()],
        "spec": str(spec),
        "url": url,
    }


def agreement(run: dict[str, Any], quiet: dict[str, Any]) -> dict[str, Any]:
    """What the loaded study reported against the quiet side-by-side of the same engines."""
    reported = run["speedup"] if run["speedup"] is not None else run["study_speedup"]
    if reported is None or quiet.get("speedup") is None:
        return {"reported": reported, "quiet": quiet}
    ratio = reported / quiet["speedup"]
    return {
        "reported": reported,
        "quiet": quiet,
        "ratio": round(ratio, 4),
        "within_10_percent": abs(ratio - 1) <= 0.10,
        "reported_faster_but_slower": reported > 1.0 and quiet["ci"][1] < 1.0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/load.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", nargs="+", choices=sorted(SCENARIOS), default=["bundled", "ocr"])
    p.add_argument("--pairs", type=int, default=1)
    p.add_argument("--trials", type=int, default=None, help="a budget other than the study's (a dry run)")
    p.add_argument(
        "--side-by-side", type=int, default=5, help="quiet processes measuring a loaded run's best route again"
    )
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    doc: dict[str, Any] = {
        "benchmark": "load",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cores": os.cpu_count(),
        "pairs": args.pairs,
        "trials": args.trials,
        "scenarios": {},
    }
    with tempfile.TemporaryDirectory(prefix="tuner-load-") as d:
        tmp = Path(d)
        for scenario in args.scenario:
            started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            commit = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
            ).stdout.strip()
            runs = []
            for i in range(args.pairs):
                for loaded in (False, True) if i % 2 == 0 else (True, False):  # alternate which goes first
                    row = one_run(scenario, tmp, i, loaded, args.trials, env)
                    if loaded and row["trial"] is not None:
                        row["agreement"] = agreement(
                            row, side_by_side(Path(row["spec"]), row["url"], row["trial"], args.side_by_side)
                        )
                    runs.append(row)
                    print(
                        f"{scenario} {'loaded' if loaded else 'quiet'}: {row['wall_s']} s, {row['trials_reached']} "
                        f"trials, {row['verdict']} {row['speedup']}",
                        flush=True,
                    )
            quiet, loaded_runs = ([r for r in runs if r["loaded"] is flag] for flag in (False, True))
            doc["scenarios"][scenario] = {
                "quiet_wall_s": statistics.median(r["wall_s"] for r in quiet),
                "loaded_wall_s": statistics.median(r["wall_s"] for r in loaded_runs),
                "same_verdict": len({r["verdict"] for r in runs}) == 1,
                "commit": commit,
                "started": started,
                "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "runs": runs,
            }
    doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if args.out.is_file():  # scenarios not run this time keep their earlier figures (each with its own times)
        earlier = json.loads(args.out.read_text()).get("scenarios", {})
        doc["scenarios"] = {**{k: v for k, v in earlier.items() if k not in doc["scenarios"]}, **doc["scenarios"]}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
