"""On a GPU host: Inductor studies whose CPU routes fork their trial children from the study's server, and whose CUDA
routes keep fresh ones, all of them completing.

1. Whether a process forked after importing what the study's server imports for an Inductor study (the worker, the
   reference run, `InductorBackend.preload`, the local search's scikit-learn) may still use CUDA
   (`torch.cuda._is_in_bad_fork()` in the forked process).
2. Three `tuner run --no-confirm` of the MLP study of bench/inductor_cpu.py, fp32 only (two routes: freezing off
   or on; budget 2; SQLite): `device = "cpu"`
   with CPU workers (children forked), `device = "auto"` with CPU workers (CUDA routes: fresh children) and
   `device = "auto"` with `--gpus 0`. Each: exit status, trial states, whether each child was asked for a fork
   (job.json `preload`), each child's status and clock.

Prints one JSON line per check and writes them after each, with the GPU's name, to `--out`
(bench/results/gpu-inductor-fork.json).
Usage (on the GPU machine, our wheels installed as bench/gpu/run_study.sh does, psycopg2-binary among them:
bench/inductor_cpu.py reads tests/conftest.py):
    python3 -m bench.gpu.inductor_fork_check
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.inductor_cpu import forked, run_command, study_file, trial_jobs
from tuner.backends.inductor import InductorBackend
from tuner.worker.forkserver import CHILD_MODULE, REFERENCE_MODULE, WORKER_MODULE
from tuner.worker.pool import SURROGATE_MODULES

REPO = Path(__file__).resolve().parents[2]
FORKED_CAN_USE_CUDA = """
import importlib, os, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
import torch
pid = os.fork()
if pid == 0:
    print("bad fork" if torch.cuda._is_in_bad_fork() else "ok", flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""
CASES = (
    ("cpu routes, CPU workers", "cpu", []),
    ("auto routes (CUDA), CPU workers", "auto", []),
    ("auto routes (CUDA), --gpus 0", "auto", ["--gpus", "0"]),
)


def server_imports() -> dict[str, Any]:
    """Whether a process forked after the study server's imports may use CUDA."""
    modules = [CHILD_MODULE, WORKER_MODULE, REFERENCE_MODULE, InductorBackend.__module__, *InductorBackend.preload]
    modules += SURROGATE_MODULES
    done = subprocess.run([sys.executable, "-c", FORKED_CAN_USE_CUDA, *modules], capture_output=True, text=True)
    return {"check": "forked after the server's imports", "modules": modules, "result": done.stdout.strip()}


def study(case: str, device: str, extra: list[str], root: Path) -> dict[str, Any]:
    """One `tuner run` of the MLP study, fp32 only, on `device` with `extra` arguments."""
    folder = root / case.replace(" ", "-").replace(",", "").replace("(", "").replace(")", "")
    spec = study_file("mlp", folder, device=device, precisions=["fp32"])
    start = time.perf_counter()
    done = subprocess.run(run_command(spec, *extra), capture_output=True, text=True, cwd=REPO)
    jobs = trial_jobs(folder)
    results = [json.loads((j.parent / "result.json").read_text()) for j in jobs if (j.parent / "result.json").exists()]
    with sqlite3.connect(folder / "study.db") as db:
        states = [state for _, state in db.execute("SELECT number, state FROM trials ORDER BY number")]
    row: dict[str, Any] = {
        "check": case,
        "exit": done.returncode,
        "wall_s": round(time.perf_counter() - start, 1),
        "states": states,
        "forked": [forked(j) for j in jobs],
        "status": [r.get("status") for r in results],
        "clock": [(r.get("timing_info") or {}).get("clock") for r in results],
    }
    if done.returncode:
        row["stderr_tail"] = done.stderr[-2000:]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "gpu-inductor-fork.json")
    args = parser.parse_args()
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    doc = {"gpu": gpu.stdout.strip(), "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "checks": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="inductor-fork-"))
    try:
        for check in [server_imports, *(lambda case=case: study(*case, root) for case in CASES)]:
            doc["checks"].append(check())
            print(json.dumps(doc["checks"][-1]), flush=True)
            args.out.write_text(json.dumps(doc, indent=1) + "\n")  # what ran so far, should a later check not end
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
