"""Real Inductor studies on a GPU machine: run them, compare default vs winner, report (bench/gpu/run_study.sh).

For each study file given: run it with `tuner run SPEC --gpus G --no-confirm` on embedded SQLite
storage (a fresh database and work directory), while sampling `nvidia-smi` once a second; then read
the trials (state, route, failure class, build/compile time, latency, GPU clocks from each trial's
result.json) and the study summary (best feasible, speedup, trials per hour). With --compare, build
the default route and the winner again in this one process (from the study's warm Inductor cache)
and time them interleaved, round after round, with the study's own timing policy: the per-round
medians give the side-by-side speedup and the coefficient of variation of repeated measurements of
one engine. The JSON document is rewritten after every stage, so a run cut short keeps what it did.

Usage: python -m bench.gpu.inductor_study --out OUT.json [--gpus 0,1] [--compare] [--rounds N] SPEC...
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("specs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--gpus", default="0", help="GPU ids for `tuner run --gpus` (one worker each)")
    p.add_argument("--compare", action="store_true", help="re-measure default vs winner side by side in this process")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--trials", type=int, default=None, help="override each study's budget")
    p.add_argument("--timeout", type=float, default=480.0, help="seconds allowed for each `tuner run`")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="first check the runner, the CUDA-event timer and CUDA graphs; stop if they fail",
    )
    args = p.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)  # `timeout` from outside: stop the study, keep what it did
    doc: dict[str, Any] = {"environment": environment(), "studies": []}
    write(args.out, doc)
    if args.smoke:
        doc["smoke"] = smoke()
        write(args.out, doc)
        if "error" in doc["smoke"]:
            sys.exit(f"GPU smoke test failed: {doc['smoke']['error']}")
    for spec_path in args.specs:
        entry: dict[str, Any] = {"spec": str(spec_path), "gpus": args.gpus}
        doc["studies"].append(entry)
        try:
            entry.update(run_study(spec_path, args.gpus, args.trials, args.timeout, args.out.parent))
            write(args.out, doc)
            if entry["returncode"] == "interrupted":
                sys.exit(130)
            if args.compare:
                entry["side_by_side"] = side_by_side(spec_path, entry["storage"], args.rounds)
        except Exception as exc:  # record and go on with the next study: device time is scarce
            entry["error"] = f"{type(exc).__name__}: {exc}"
        except KeyboardInterrupt:
            entry["error"] = "interrupted"
            write(args.out, doc)
            sys.exit(130)
        write(args.out, doc)
    print(json.dumps(doc, indent=1, default=str)[-6000:])


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str))


def environment() -> dict[str, Any]:
    """Versions, the GPUs nvidia-smi lists, and what the shared CUDA-event timer reads."""
    import torch

    from tuner.measure.gpu_timing import CudaEventTimer, GpuTimingError

    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpus": _smi(["-L"]).splitlines(),
        "cpus": os.cpu_count(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        timer = CudaEventTimer()
    except GpuTimingError as exc:
        env["timer"] = str(exc)
        return env
    env["timer"] = timer.info()
    timer.close()
    return env


def smoke() -> dict[str, Any]:
    """A small MLP through the real Inductor runner on CUDA: plain and CUDA-graph modes, eager-equal and timed."""
    import numpy as np
    import torch

    from tuner.backends.inductor.engine import Engine
    from tuner.backends.inductor.run import InductorRunner
    from tuner.backends.inductor.space import compile_options
    from tuner.measure.timing import summarize

    out: dict[str, Any] = {}
    try:
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).eval()
        feed = {"x": np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)}
        with torch.no_grad():
            want = model(torch.from_numpy(feed["x"])).numpy()
        for mode in ("default", "reduce-overhead"):
            t0 = time.perf_counter()
            route = {"mode": mode, "precision": "fp32"}
            engine = Engine.create({(feed["x"].shape,): model}, route, "cuda", ["x"], ["y"], compile_options(route, {}))
            runner = InductorRunner(engine)
            got = [runner.infer(feed)["y"] for _ in range(4)][-1]
            once = runner.timed(feed)
            stats = summarize([once() * 1000 for _ in range(200)])
            out[mode] = {
                "max_abs_vs_eager": float(np.abs(got - want).max()),
                "compile_and_check_s": round(time.perf_counter() - t0, 2),
                "median_ms": stats.median,
                "cv": stats.cv,
                "timing_info": runner.timing_info(),
            }
            runner.close()
    except Exception as exc:  # report, and let the caller stop before spending device time on studies
        import traceback

        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()[-3000:]
    return out


def _smi(args: list[str]) -> str:
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi failed: {exc}"


class GpuSampler:
    """`nvidia-smi` utilisation and memory once a second, in a background process, while a study runs."""

    def __init__(self) -> None:
        self.rows: list[list[str]] = []
        try:
            self.proc: subprocess.Popen[str] | None = subprocess.Popen(
                [
                    "nvidia-smi",
                    "--query-gpu=index,utilization.gpu,memory.used,clocks.sm",
                    "--format=csv,noheader,nounits",
                    "-l",
                    "1",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        except OSError:  # no nvidia-smi: a CPU dry run
            self.proc = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        if self.proc is None or self.proc.stdout is None:
            return
        for line in self.proc.stdout:
            self.rows.append([c.strip() for c in line.split(",")])

    def stop(self) -> dict[str, Any]:
        """Per GPU: samples, mean utilisation, share of samples with utilisation > 0, peak memory."""
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
        self.thread.join(timeout=5)
        out: dict[str, Any] = {}
        for gpu in sorted({r[0] for r in self.rows if len(r) == 4}):
            rows = [r for r in self.rows if len(r) == 4 and r[0] == gpu and r[1].isdigit()]
            util = [int(r[1]) for r in rows]
            out[gpu] = {
                "samples": len(rows),
                "mean_util_pct": round(statistics.fmean(util), 1) if util else None,
                "busy_share": round(sum(u > 0 for u in util) / len(util), 3) if util else None,
                "peak_mem_mib": max((int(r[2]) for r in rows if r[2].isdigit()), default=None),
                "max_sm_clock_mhz": max((int(r[3]) for r in rows if r[3].isdigit()), default=None),
            }
        return out


def run_study(spec_path: Path, gpus: str, trials: int | None, timeout: float, log_dir: Path) -> dict[str, Any]:
    """Run the study from scratch with `tuner run` and summarise what it did."""
    from tuner.spec import load_spec

    spec = load_spec(spec_path)
    shutil.rmtree(spec.work_dir, ignore_errors=True)
    spec.work_dir.mkdir(parents=True)
    storage = f"sqlite:///{spec.work_dir / 'study.db'}"
    cmd = [sys.executable, "-m", "tuner", "run", str(spec_path), "--storage", storage, "--gpus", gpus, "--no-confirm"]
    cmd += ["--trials", str(trials)] if trials else []
    sampler = GpuSampler()
    t0 = time.time()
    log = log_dir / f"{spec.study}-gpus{gpus.replace(',', '-')}.log"
    with open(log, "w") as f:
        rc = run_bounded(cmd, f, timeout)
    wall = time.time() - t0
    return {
        "study": spec.study,
        "storage": storage,
        "returncode": rc,
        "run_wall_s": round(wall, 1),
        "gpu_samples": sampler.stop(),
        **collect(spec, storage, wall),
    }


def run_bounded(cmd: list[str], log: Any, timeout: float) -> int | str:
    """Run `cmd`; past `timeout`, interrupt it like Ctrl-C (trials in flight are marked interrupted), then kill."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return "timeout" if isinstance(exc, subprocess.TimeoutExpired) else "interrupted"


def collect(spec: Any, storage: str, wall: float) -> dict[str, Any]:
    """Per-trial facts and the study summary from the database and the trials' result.json files."""
    from tuner.study import attrs as A
    from tuner.study.setup import Context
    from tuner.study.summary import summarize_study

    ctx = Context(spec, storage)
    study = ctx.load()
    summary = summarize_study(study)
    trials = []
    for t in study.get_trials(deepcopy=False):
        result_file = ctx.trials_dir / f"{t.number:05d}" / "result.json"
        result = json.loads(result_file.read_text()) if result_file.exists() else {}
        trials.append(
            {
                "number": t.number,
                "state": t.state.name,
                "params": t.params,
                "value_ms": t.value,
                "failure_class": t.user_attrs.get(A.FAILURE_CLASS, ""),
                "message": t.user_attrs.get(A.MESSAGE, "")[:300],
                "worker": t.user_attrs.get(A.WORKER),
                "build_s": t.user_attrs.get(A.BUILD_S),
                "latency_ms": t.user_attrs.get(A.LATENCY_MS),
                "accuracy": t.user_attrs.get(A.ACCURACY),
                "wall_s": (t.datetime_complete - t.datetime_start).total_seconds()
                if t.datetime_complete and t.datetime_start
                else None,
                "timing_info": result.get("timing_info"),
                "artifact_bytes": result.get("artifact_bytes"),
                "speedup_paired": t.user_attrs.get(A.SPEEDUP_PAIRED),
                "speedup_paired_ci": t.user_attrs.get(A.SPEEDUP_PAIRED_CI),
                "timing": t.user_attrs.get(A.TIMING),
            }
        )
    finished = [t for t in trials if t["state"] in ("COMPLETE", "PRUNED", "FAIL")]
    builds = [t["build_s"] for t in trials if t["build_s"] is not None]
    return {
        "summary": summary.status_json(),
        "default_route": study.user_attrs.get(A.DEFAULT_ROUTE),
        "best_route": summary.best.params if summary.best else None,
        "trials_per_hour": round(len(finished) / (summary.elapsed_s / 3600), 1) if summary.elapsed_s else None,
        "trials_per_hour_wall": round(len(finished) / (wall / 3600), 1) if wall else None,
        "build_s": {"median": statistics.median(builds), "min": min(builds), "max": max(builds)} if builds else None,
        "trials": trials,
    }


def side_by_side(spec_path: Path, storage: str, rounds: int) -> dict[str, Any]:
    """Default and winner built in this process and timed interleaved for `rounds` rounds."""
    from tuner.backends.base import BuildContext
    from tuner.measure.inputs import read_feeds
    from tuner.measure.timing import TimingPolicy, measure, summarize
    from tuner.spec import load_spec
    from tuner.study.setup import Context
    from tuner.study.summary import summarize_study

    ctx = Context(load_spec(spec_path), storage)
    summary = summarize_study(ctx.load())
    if summary.best is None:
        return {"skipped": "no feasible route"}
    routes = {"default": ctx.space.default_route(), "winner": dict(summary.best.params)}
    if routes["winner"] == routes["default"]:
        return {"skipped": "the default route won"}
    feeds = read_feeds(ctx.feeds_path)
    runners = {}
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(ctx.work_dir / "inductor-cache")  # the study's warm cache
    try:
        for label, route in routes.items():
            bctx = BuildContext(ctx.model_info, ctx.work_dir, ctx.work_dir / "side-by-side" / label, feeds)
            artifact = ctx.backend.build(route, bctx)
            runners[label] = (ctx.backend.load(artifact, route, bctx), artifact.info)
    finally:
        del os.environ["TORCHINDUCTOR_CACHE_DIR"]  # later studies' workers start cold, as this one's did
    o = ctx.spec.objective
    policy = TimingPolicy(o.warmup_s, o.min_repeats, 0.5 if o.min_duration_s is None else o.min_duration_s)
    per_round: dict[str, list[dict[str, float]]] = {label: [] for label in routes}
    for i in range(rounds):
        order = list(routes) if i % 2 == 0 else list(reversed(routes))
        for label in order:
            per_round[label].append(summarize(measure(runners[label][0].timed(feeds[0]), policy)).to_dict())
    out: dict[str, Any] = {"rounds": rounds, "policy": policy.__dict__, "routes": routes}
    for label, stats in per_round.items():
        medians = [s["median"] for s in stats]
        out[label] = {
            "median_ms": statistics.median(medians),
            "round_medians_ms": [round(m, 5) for m in medians],
            "cv_between_rounds": statistics.pstdev(medians) / statistics.fmean(medians),
            "cv_within_round_median": statistics.median(s["cv"] for s in stats),
            "compile_s": runners[label][1].get("compile_s"),
            "cache_hits": runners[label][1].get("cache_hits"),
            "timing_info": runners[label][0].timing_info(),
        }
    ratios = [d["median"] / w["median"] for d, w in zip(per_round["default"], per_round["winner"])]
    out["speedup"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    out["paired"] = paired_in_process(runners["winner"][0], runners["default"][0], feeds[0], ctx.spec.objective)
    for runner, _ in runners.values():
        runner.close()
    return out


def paired_in_process(winner: Any, default: Any, feed: Any, objective: Any) -> dict[str, Any]:
    """The same two engines measured the way a trial now is: ABBA blocks, adaptive stop (tuner.measure.paired).

    Besides the speedup and its interval: how much each engine's block level moved during it (the
    drift the absolute numbers carry) against the spread of the per-cycle ratios (what pairing leaves).
    """
    from tuner import job as J
    from tuner.measure.paired import measure_paired
    from tuner.worker.timing import block_fn, policy_for

    job = J.Job(
        backend="",
        route={},
        model_path="",
        input_shapes={},
        options={},
        work_dir="",
        out_dir="",
        feeds_path="",
        reference_path="",
        metric="",
        tolerance=0.0,
        atol=0.0,
        rtol=0.0,
        gate_samples=0,
        timeout_s=0.0,
        objective=objective,
    )
    r = measure_paired(
        block_fn(winner, feed, objective.mode), block_fn(default, feed, objective.mode), policy_for(job, gpu=True)
    )

    def spread(values: list[float]) -> dict[str, float]:
        return {"min": min(values), "max": max(values), "cv": statistics.pstdev(values) / statistics.fmean(values)}

    cycle_ratios = [math.exp(d) for d in r.log_ratios]
    return {
        **r.summary(),
        "cycle_speedup": spread(cycle_ratios),
        "default_block_ms": spread(r.baseline_blocks),
        "winner_block_ms": spread(r.candidate_blocks),
    }


if __name__ == "__main__":
    main()
