"""Does ONNX Runtime's thread-pool spinning bias the paired (two engines in one process) speedup?

The bundled EfficientNet-Lite0 in fp32 (the default route's model) and in int8 (ORT's static QDQ
U8S8 per-channel recipe, calibrated on the bundled validation inputs) are timed on the CPU with ORT's
default threading (intra-op threads 0, sequential), in rounds. Each round, for each session setting
(ORT's default, and `session.force_spinning_stop=1`, what the tuner's sessions use), one after another:

- **paired**: both engines in one fresh process, ABBA blocks of about 50 ms (as a trial's timing),
  `--cycles` cycles: the Hodges-Lehmann speedup and each engine's median block;
- **solo**: each engine alone in its own fresh process (as a confirmation round): median block of
  `--blocks` blocks each, and the ratio of the two.

Recorded per round and setting: the paired speedup and both medians, the solo ratio and both medians,
the load average; and the machine. Writes bench/results/ort-spinning.json.

Usage: python bench/ort_spinning.py [--rounds 4] [--cycles 60] [--blocks 60]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "models" / "efficientnet_lite0.onnx"
VAL = REPO / "models" / "efficientnet_lite0_val.npz"
OUT = REPO / "bench" / "results" / "ort-spinning.json"
SETTINGS = {"ort-default": {}, "force_spinning_stop": {"session.force_spinning_stop": "1"}}
BLOCK_S = 0.05


def first_input() -> np.ndarray:
    with np.load(VAL) as data:
        return np.asarray(data[data.files[0]], dtype=np.float32)


def make_int8(dest: Path) -> Path:
    """The int8 engine: ORT's static QDQ quantization (U8S8, per channel) calibrated on the validation inputs."""
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre, out = dest / "pre.onnx", dest / "int8.onnx"
    quant_pre_process(str(MODEL), str(pre))
    name, x = ort.InferenceSession(str(MODEL)).get_inputs()[0].name, first_input()

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([{name: x[i : i + 1]} for i in range(min(16, len(x)))])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    quantize_static(
        str(pre),
        str(out),
        Reader(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
    )
    return out


def engine(path: str, config: dict[str, str]) -> Any:
    """A callable timing one inference (seconds) of the model at `path` with session `config`."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    for key, value in config.items():
        opts.add_session_config_entry(key, value)
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: first_input()[:1]}

    def once() -> float:
        t0 = time.perf_counter()
        session.run(None, feed)
        return time.perf_counter() - t0

    for _ in range(30):
        once()
    return once


def block(once: Any, calls: int) -> float:
    return statistics.median(once() * 1000.0 for _ in range(calls))


def calls_per_block(once: Any) -> int:
    return max(3, int(BLOCK_S / statistics.median(once() for _ in range(5))))


def child(mode: str, paths: list[str], config: dict[str, str], n: int) -> dict[str, float]:
    """Runs in a fresh process: `paired` (ABBA over both paths) or `solo` (the one path)."""
    from tuner.measure.speedup import speedup_from_log_ratios

    if mode == "solo":
        once = engine(paths[0], config)
        calls = calls_per_block(once)
        return {"median_ms": statistics.median(block(once, calls) for _ in range(n))}
    a, b = engine(paths[0], config), engine(paths[1], config)
    na, nb = calls_per_block(a), calls_per_block(b)
    d, am, bm = [], [], []
    for _ in range(n):
        a1, b1, b2, a2 = block(a, na), block(b, nb), block(b, nb), block(a, na)
        am += [a1, a2]
        bm += [b1, b2]
        d.append((np.log(a1) + np.log(a2) - np.log(b1) - np.log(b2)) / 2)
    s = speedup_from_log_ratios(d, 0.95)
    return {
        "speedup": s.estimate,
        "low": s.low,
        "high": s.high,
        "fp32_ms": statistics.median(am),
        "int8_ms": statistics.median(bm),
    }


def run_child(mode: str, paths: list[str], config: dict[str, str], n: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, json.dumps({"paths": paths, "config": config, "n": n})],
        check=True,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--cycles", type=int, default=60)
    p.add_argument("--blocks", type=int, default=60)
    p.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        job = json.loads(args.child[1])
        print(json.dumps(child(args.child[0], job["paths"], job["config"], job["n"])))
        return
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        fp32, int8 = str(MODEL), str(make_int8(Path(tmp)))
        rows = []
        for r in range(args.rounds):
            for name, config in SETTINGS.items():
                paired = run_child("paired", [fp32, int8], config, args.cycles)
                solo_a = run_child("solo", [fp32], config, args.blocks)["median_ms"]
                solo_b = run_child("solo", [int8], config, args.blocks)["median_ms"]
                row = {
                    "round": r + 1,
                    "setting": name,
                    "paired": paired,
                    "solo": {"ratio": solo_a / solo_b, "fp32_ms": solo_a, "int8_ms": solo_b},
                    "loadavg": [round(v, 2) for v in os.getloadavg()],
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary = {
        name: {
            "paired_speedups": [round(r["paired"]["speedup"], 3) for r in rows if r["setting"] == name],
            "solo_ratios": [round(r["solo"]["ratio"], 3) for r in rows if r["setting"] == name],
            "paired_fp32_ms": [round(r["paired"]["fp32_ms"], 3) for r in rows if r["setting"] == name],
            "solo_fp32_ms": [round(r["solo"]["fp32_ms"], 3) for r in rows if r["setting"] == name],
        }
        for name in SETTINGS
    }
    doc = {
        "benchmark": "bench/ort_spinning.py",
        "model": "models/efficientnet_lite0.onnx (fp32) vs its ORT static QDQ U8S8 int8",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "onnxruntime": __import__("onnxruntime").__version__,
        },
        "settings": SETTINGS,
        "cycles": args.cycles,
        "blocks": args.blocks,
        "summary": summary,
        "rounds": rows,
    }
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
