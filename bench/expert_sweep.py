"""What an ONNX Runtime user tries first, by hand, against the tuner's confirmed winner, side by side.

For one study file: runs (or resumes) the study with `--trials BUDGET` on its own storage, then builds
the recipe list an ORT user tries first with ONNX Runtime's own API — default session; graph levels;
thread counts; `quant_pre_process` + `quantize_static` U8S8 and S8S8 Q/DQ per-channel (MinMax on the
study's feeds), U8S8 with `reduce_range` (ORT's advice for CPUs without VNNI); `quantize_dynamic`;
fp16 with fp32 IO — and times every recipe and the tuner's winner (its artifact, with its session
options) interleaved in rounds in one process, each block after a short warm-up. A speedup is the
Hodges-Lehmann estimate of the per-round default/candidate ratios with its Wilcoxon interval.
Accuracy is the study's metric against the fp32 model on the study's feeds.

Usage: python bench/expert_sweep.py --spec studies/efficientnet_lite0.toml [--budget 30] [--rounds 15]
Results are merged into bench/results/expert-sweep.json (one entry per study).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

from tuner.backends.base import Artifact  # noqa: E402
from tuner.measure.accuracy import Tolerances, compare, worst  # noqa: E402
from tuner.measure.speedup import speedup_interval  # noqa: E402
from tuner.spec import load_spec  # noqa: E402
from tuner.store.cache import ResultStore  # noqa: E402
from tuner.study.documents import best_document  # noqa: E402
from tuner.study.setup import Context  # noqa: E402

OUT = REPO / "bench" / "results" / "expert-sweep.json"
OLIVE = {
    "tool": "Microsoft Olive 0.13",
    "speedup": 1.80,
    "model": "efficientnet_lite0.onnx",
    "top1_unchanged": "16/16",
    "source": "measured side by side on a 2-core AMD EPYC with AVX-512 VNNI (not this machine); "
    "35 steps (TPE over static-quantization knobs + session tuning) in 2 min 47 s; not re-run here",
}


def session(path: Path, level: str = "ORT_ENABLE_ALL", threads: int = 0) -> ort.InferenceSession:
    """An InferenceSession as an ORT user makes one."""
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def recipes(
    model: Path, feeds: list[dict[str, np.ndarray]], work: Path
) -> dict[str, Callable[[], ort.InferenceSession]]:
    """The recipe list, each a function making its session (quantized files are written under `work`)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process
    from onnxruntime.transformers.float16 import convert_float_to_float16

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

    prep = work / "prep.onnx"

    def prepared() -> Path:
        if not prep.exists():
            quant_pre_process(str(model), str(prep))
        return prep

    def static(name: str, act: QuantType, reduce_range: bool = False) -> Callable[[], ort.InferenceSession]:
        def make() -> ort.InferenceSession:
            out = work / f"{name}.onnx"
            quantize_static(
                str(prepared()),
                str(out),
                Reader(),
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                reduce_range=reduce_range,
                activation_type=act,
                weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax,
            )
            return session(out)

        return make

    def dynamic() -> ort.InferenceSession:
        out = work / "dynamic.onnx"
        quantize_dynamic(str(prepared()), str(out), weight_type=QuantType.QInt8)
        return session(out)

    def fp16() -> ort.InferenceSession:
        import onnx

        out = work / "fp16.onnx"
        onnx.save(convert_float_to_float16(onnx.load(str(model)), keep_io_types=True), str(out))
        return session(out)

    cores = os.cpu_count() or 1
    return {
        "graph level extended": lambda: session(model, "ORT_ENABLE_EXTENDED"),
        "graph level basic": lambda: session(model, "ORT_ENABLE_BASIC"),
        "1 thread": lambda: session(model, threads=1),
        f"{cores} threads": lambda: session(model, threads=cores),
        "quantize_static U8S8 QDQ per-channel": static("u8s8", QuantType.QUInt8),
        "quantize_static U8S8 QDQ per-channel reduce_range": static("u8s8_rr", QuantType.QUInt8, reduce_range=True),
        "quantize_static S8S8 QDQ per-channel": static("s8s8", QuantType.QInt8),
        "quantize_dynamic (S8 weights)": dynamic,
        "fp16, IO kept fp32": fp16,
    }


def tuner_winner(spec_path: Path, budget: int, storage: str, rerun: bool = True) -> tuple[dict[str, Any], Any]:
    """Run (or resume) the study to `budget` trials with confirmation; its best document and runner.

    With `rerun` False the study is only read, as it is (its verdict says whether it was confirmed).
    """
    run = [sys.executable, "-m", "tuner", "run", str(spec_path), "--trials", str(budget), "--storage", storage]
    t0 = time.time()
    if rerun:
        subprocess.run(run, check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    spec = load_spec(spec_path)
    ctx = Context(spec, storage)
    doc = best_document(ctx, ctx.load())[0]
    doc["study_wall_s"] = round(time.time() - t0, 1)
    record = ResultStore(ctx.url).artifact(doc["artifact_sha256"])
    runner = ctx.backend.load(Artifact(Path(record.path), 0.0), doc["route"], None)
    return doc, runner


def time_block(run: Callable[[], Any], calls: int, warm: int = 3) -> float:
    """Median latency (ms) of `calls` inferences after `warm` untimed ones."""
    for _ in range(warm):
        run()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        run()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--spec", required=True)
    p.add_argument("--budget", type=int, default=30)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--storage", default=None, help="default: a SQLite file beside the study's work dir")
    p.add_argument(
        "--table", action="store_true", help="only print the docs/benchmarks.md table of the recorded results"
    )
    p.add_argument(
        "--no-run", action="store_true", help="read the study as it is (its verdict, confirmed or not); run no trial"
    )
    args = p.parse_args()
    if args.table:
        print(table(json.loads(OUT.read_text())))
        return
    spec_path = Path(args.spec).resolve()
    spec = load_spec(spec_path)
    storage = args.storage or f"sqlite:///{spec.work_dir / 'expert-sweep.db'}"
    spec.work_dir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    doc, winner = tuner_winner(spec_path, args.budget, storage, rerun=not args.no_run)
    ctx = Context(spec, storage)
    feeds = ctx.feeds
    tol = Tolerances(spec.accuracy.atol, spec.accuracy.rtol)
    default = session(spec.model.path)
    names = [o.name for o in default.get_outputs()]
    reference = [dict(zip(names, default.run(names, f))) for f in feeds]
    with tempfile.TemporaryDirectory() as tmp:
        candidates: dict[str, Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]] = {}
        made: dict[str, dict[str, Any]] = {}
        for name, make in recipes(spec.model.path, feeds, Path(tmp)).items():
            t0 = time.perf_counter()
            try:
                sess = make()
            except Exception as exc:  # a recipe ORT cannot make on this model is a result, not a crash
                made[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                continue
            made[name] = {"make_s": round(time.perf_counter() - t0, 2)}
            candidates[name] = lambda f, s=sess: dict(zip(names, s.run(names, f)))
        candidates[f"tuner winner (trial {doc['trial']})"] = winner.infer
        for name, infer in candidates.items():
            per = compare(spec.accuracy.metric, [infer(f) for f in feeds], reference, tol)
            made.setdefault(name, {})["accuracy"] = round(worst(per), 6)
            made[name]["feasible"] = worst(per) <= spec.accuracy.tolerance
        feed = feeds[0]
        order = ["default", *candidates]
        runs = {
            "default": lambda: default.run(names, feed),
            **{n: (lambda i=i: i(feed)) for n, i in candidates.items()},
        }
        lat: dict[str, list[float]] = {n: [] for n in order}
        rng = random.Random(0)
        for _ in range(args.rounds):
            rng.shuffle(order)
            for name in order:
                lat[name].append(time_block(runs[name], args.calls))
    rows = []
    for name in ["default", *candidates]:
        row = {"recipe": name, "median_ms": round(statistics.median(lat[name]), 3), **made.get(name, {})}
        if name != "default":
            s = speedup_interval(lat["default"], lat[name], 0.95)
            row.update(speedup=round(s.estimate, 3), ci95=[round(s.low, 3), round(s.high, 3)])
        rows.append(row)
    for name, info in made.items():
        if "error" in info:
            rows.append({"recipe": name, **info})
    feasible = [r for r in rows if r.get("feasible") and "speedup" in r and not r["recipe"].startswith("tuner")]
    best_recipe = max(feasible, key=lambda r: r["speedup"], default=None)
    result = {
        "study": spec.study,
        "model": spec.model.path.name,
        "metric": spec.accuracy.metric,
        "tolerance": spec.accuracy.tolerance,
        "rounds": args.rounds,
        "calls_per_block": args.calls,
        "onnxruntime": ort.__version__,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "cpu": _cpu(),
        "tuner": {
            "budget": args.budget,
            "trial": doc["trial"],
            "route": doc["route"],
            "verdict": doc.get("verdict"),
            "confirmed_speedup": doc.get("speedup"),
            "confirmed_ci": doc.get("speedup_ci"),
            "headline": doc.get("headline"),
            "study_wall_s": doc["study_wall_s"],
        },
        "recipes": rows,
        "best_feasible_recipe": best_recipe["recipe"] if best_recipe else None,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if spec.model.path.name == OLIVE["model"]:
        result["olive_reference"] = OLIVE
    merged = json.loads(OUT.read_text()) if OUT.exists() else {"benchmark": "expert-sweep", "studies": {}}
    merged["studies"][spec.study] = result
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(merged, indent=2) + "\n")
    print(json.dumps(result, indent=2))


def table(doc: dict[str, Any]) -> str:
    """The docs/benchmarks.md table: every study's recipes, speedup over the default with its interval, accuracy."""
    lines = [
        "| model | recipe | median ms | speedup vs default (95% CI) | accuracy (metric ≤ tolerance) |",
        "|---|---|---|---|---|",
    ]
    for r in doc["studies"].values():
        for row in r["recipes"]:
            if "error" in row:
                lines.append(f"| {r['model']} | {row['recipe']} | - | failed: {row['error'][:60]} | - |")
                continue
            sp = f"{row['speedup']:.2f}x ({row['ci95'][0]:.2f}–{row['ci95'][1]:.2f})" if "speedup" in row else "1.00x"
            ok = "reference" if row["recipe"] == "default" else "ok" if row.get("feasible") else "**breaks tolerance**"
            lines.append(
                f"| {r['model']} | {row['recipe']} | {row['median_ms']:.2f} | {sp} | {row.get('accuracy', 0):.4g} ≤ "
                f"{r['tolerance']:g}: {ok} |"
            )
    return "\n".join(lines)


def _cpu() -> dict[str, Any]:
    from tuner.backends.onnxruntime.quant_space import cpu_flags, recommendation

    return {
        "cores": os.cpu_count(),
        "vnni": bool(cpu_flags() & {"avx512_vnni", "avx_vnni"}),
        "ort_recommendation": recommendation().reason,
    }


if __name__ == "__main__":
    main()
