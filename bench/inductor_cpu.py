"""Inductor on the CPU: a study's whole `tuner run`, today's code against an earlier commit's, side by side.

`--rounds` times, alternating which goes first: `tuner run SPEC --no-confirm` of a fresh study (fresh
SQLite storage and work dir) with the code of `--against` (unpacked with `git archive`, as
bench/measurement.py does) and with today's, on one scenario:
- `mlp`: the test suite's MLP (x [2,16] -> Pad -> MatMul -> Add -> Relu -> MatMul -> Reshape), four routes
  (fp32 or bf16, freezing off or on), budget 4: compiling takes about a second, so what a trial's child
  costs besides its compile shows;
- `efficientnet`: the bundled EfficientNet-Lite0 and its validation images, two routes (freezing off or on),
  budget 2: a real CNN, whose compile takes far longer.
Each run records the command's wall time, the CPU time of all its processes (this process's waited-for
children), and for each trial whether its child was forked from the study's server (job.json `preload`).
Both sides use torch's default Inductor cache of the machine, warmed by one unrecorded run of today's code
first, so neither side compiles from a cold cache.

Writes the scenario's entry of bench/results/inductor-cpu.json: the runs, the load average around each,
and per round today's wall and CPU over the earlier code's (median and range over the rounds).

Usage: python bench/inductor_cpu.py --against COMMIT [--scenario mlp|efficientnet] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.measurement import unpack  # noqa: E402
from tuner.spec.toml import dumps  # noqa: E402

OUT = REPO / "bench" / "results" / "inductor-cpu.json"
OBJECTIVE = {"warmup_s": 0.0, "min_repeats": 5, "min_duration_s": 0.02, "block_s": 0.002, "timing_cap_s": 0.2}


def study_file(scenario: str, folder: Path, device: str = "cpu", precisions: Sequence[str] | None = None) -> Path:
    """A fresh study of `scenario` in `folder` (its model, data and work dir there or absolute) on `device`: its routes
    are `precisions` (the scenario's own by default) each with freezing off and on, its budget one trial a route."""
    folder.mkdir(parents=True)
    if scenario == "mlp":
        from tests.models import mlp_onnx

        model: dict[str, Any] = {"path": str(mlp_onnx(folder / "mlp.onnx"))}
        data: dict[str, Any] = {"samples": 4, "gate_samples": 2}
        accuracy = {"metric": "max_abs", "tolerance": 0.1}
        precisions = precisions or ("fp32", "bf16")
    else:
        model = {
            "path": str(REPO / "models" / "efficientnet_lite0.onnx"),
            "inputs": {"images": {"shape": [1, 3, 224, 224]}},
        }
        data = {"file": str(REPO / "models" / "efficientnet_lite0_val.npz"), "samples": 4, "gate_samples": 2}
        accuracy = {"metric": "top1_mismatch", "tolerance": 0.5}
        precisions = precisions or ("fp32",)
    space = {"mode": ["default"], "precision": list(precisions), "freezing": [False, True]}
    doc = {
        "study": {"name": scenario, "work_dir": str(folder / "work")},
        "model": model,
        "data": data,
        "accuracy": accuracy,
        "objective": OBJECTIVE,
        "backend": {"name": "inductor", "options": {"device": device}, "space": space},
        "run": {"budget": 2 * len(precisions), "racing": False, "trial_timeout_s": 900.0},
    }
    path = folder / "study.toml"
    path.write_text(dumps(doc))
    return path


def run_command(spec: Path, *extra: str) -> list[str]:
    """`tuner run --no-confirm` of `spec` on a SQLite storage beside it."""
    storage = f"sqlite:///{spec.parent / 'study.db'}"
    return [sys.executable, "-m", "tuner", "run", str(spec), "--storage", storage, "--no-confirm", *extra]


def trial_jobs(folder: Path) -> list[Path]:
    """The job files of the trials of the study `study_file` wrote in `folder`."""
    return sorted((folder / "work").glob("trials/*/*/job.json"))


def forked(job: Path) -> bool:
    """Whether the trial's child was asked for from the study's server (the job names what the server preloads)."""
    return json.loads(job.read_text()).get("preload") is not None


def one_run(label: str, code: Path, scenario: str, folder: Path) -> dict[str, Any]:
    """`tuner run` of a fresh `scenario` study with the code in `code`: wall, CPU of all its processes, forks."""
    spec = study_file(scenario, folder)
    env = {**os.environ, "PYTHONPATH": str(code)}
    load_before = os.getloadavg()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(run_command(spec), cwd=code, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    row: dict[str, Any] = {
        "label": label,
        "exit": done.returncode,
        "wall_s": round(wall, 2),
        "cpu_s": round(now.ru_utime - used.ru_utime + now.ru_stime - used.ru_stime, 2),
        "children_forked": [forked(j) for j in trial_jobs(folder)],
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    if done.returncode:
        row["stderr_tail"] = done.stderr[-2000:]
    print(json.dumps(row), flush=True)
    return row


def ratios(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Today's `key` over the earlier code's, round by round: median and range."""
    by_round: dict[int, dict[str, float]] = {}
    for r in runs:
        by_round.setdefault(r["round"], {})[r["label"]] = r[key]
    values = [v["now"] / v["then"] for v in by_round.values() if {"now", "then"} <= set(v)]
    return {"median": round(statistics.median(values), 3), "range": [round(min(values), 3), round(max(values), 3)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the earlier commit")
    parser.add_argument("--scenario", choices=["mlp", "efficientnet"], default="mlp")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    now_commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        then = unpack(args.against, root / "then")
        one_run("warm-up", REPO, args.scenario, root / "warm-up")
        runs = []
        for i in range(args.rounds):
            for label in ("then", "now") if i % 2 == 0 else ("now", "then"):
                code = then if label == "then" else REPO
                runs.append({"round": i, **one_run(label, code, args.scenario, root / f"{label}-{i}")})
    entry = {
        "then_commit": args.against,
        "now_commit": now_commit.stdout.strip(),
        "started": started,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "runs": runs,
        "now_over_then": {"wall": ratios(runs, "wall_s"), "cpu": ratios(runs, "cpu_s")},
    }
    doc = json.loads(OUT.read_text()) if OUT.exists() else {}
    doc[args.scenario] = entry
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(entry["now_over_then"]))


if __name__ == "__main__":
    main()
