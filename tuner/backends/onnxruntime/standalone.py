#!/usr/bin/env python3
"""Run an exported ONNX Runtime engine in the session it was measured with; needs only onnxruntime and numpy.

    python run_onnxruntime.py [--data inputs.npz] [--runs 100]

reads `session.json` beside this file: the model file, the session options, config entries and
providers by ONNX Runtime's own names, and the model's inputs. `--data` is an .npz of arrays keyed by
input name, samples laid along each input's batch axis (a scalar input: one value per sample, or one
for all); without it the inputs are random values of the measured shapes. Every sample is run once to
warm up, then `--runs` calls cycle through them; one JSON line reports the median latency and the
outputs' shapes.

Route Tuner opens every ONNX Runtime session it times with `open_session` below; this file is that code.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

ENUMS = {"graph_optimization_level": ort.GraphOptimizationLevel, "execution_mode": ort.ExecutionMode}


def open_session(model: str | Path, settings: dict[str, Any]) -> ort.InferenceSession:
    """An InferenceSession over `model` with `settings` (session_options, config_entries, providers,
    provider_options)."""
    opts = ort.SessionOptions()
    for name, value in settings["session_options"].items():
        setattr(opts, name, getattr(ENUMS[name], value) if name in ENUMS else value)
    for key, value in settings["config_entries"].items():
        opts.add_session_config_entry(key, value)
    return ort.InferenceSession(
        str(model), opts, providers=settings["providers"], provider_options=settings["provider_options"]
    )


def samples(data: dict[str, np.ndarray], inputs: dict[str, dict[str, Any]]) -> list[dict[str, np.ndarray]]:
    """The feeds in `data`: sample i of each input along its batch axis (a 0-D array is one value for all)."""
    missing = sorted(set(inputs) - set(data) - {n for n, i in inputs.items() if "value" in i})
    if missing:
        raise SystemExit(
            f"--data has no array for input(s) {', '.join(missing)}; it has {', '.join(sorted(data)) or 'none'}"
        )

    def array(name: str) -> np.ndarray:
        spec = inputs[name]
        return np.asarray(data[name] if name in data else spec["value"], dtype=spec["dtype"])

    def count(name: str) -> int:
        spec, value = inputs[name], array(name)
        axis = spec["batch_axis"]
        return len(value) if axis is None else value.shape[axis] // max(1, spec["shape"][axis])

    n = min((count(name) for name in inputs if array(name).ndim), default=1)
    if n == 0:
        raise SystemExit("--data holds no whole sample of the measured shapes")
    feeds = []
    for i in range(n):
        feed = {}
        for name, spec in inputs.items():
            value, axis = array(name), spec["batch_axis"]
            if value.ndim == 0:
                feed[name] = value
            elif axis is None:
                feed[name] = value[i]
            else:
                width = max(1, spec["shape"][axis])
                feed[name] = np.take(value, range(i * width, (i + 1) * width), axis=axis)
        feeds.append(feed)
    return feeds


def random_feed(inputs: dict[str, dict[str, Any]], seed: int = 0) -> dict[str, np.ndarray]:
    """One feed of the measured shapes: uniform in [-1, 1) for floats, zeros for integers, or the study's constant."""
    rng = np.random.default_rng(seed)
    feed = {}
    for name, spec in inputs.items():
        dtype = np.dtype(spec["dtype"])
        if "value" in spec:
            feed[name] = np.full(spec["shape"], spec["value"], dtype)
        elif dtype.kind == "f":
            feed[name] = rng.uniform(-1.0, 1.0, spec["shape"]).astype(dtype)
        else:
            feed[name] = np.zeros(spec["shape"], dtype)
    return feed


def main(argv: list[str] | None = None) -> int:
    """Open the session of `session.json`, run the feeds, print the median latency and the outputs' shapes."""
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description="Run the exported engine in the session it was measured with.")
    parser.add_argument("--data", type=Path, help=".npz of inputs keyed by input name (default: random inputs)")
    parser.add_argument("--runs", type=int, default=100, help="timed calls (default 100)")
    parser.add_argument(
        "--session", type=Path, default=here / "session.json", help="the session settings (default: beside this file)"
    )
    args = parser.parse_args(argv)
    settings = json.loads(args.session.read_text())
    session = open_session(args.session.parent / settings["model"], settings)
    inputs = settings["inputs"]
    if args.data:
        with np.load(args.data) as data:
            feeds = samples({k: data[k] for k in data.files}, inputs)
    else:
        feeds = [random_feed(inputs)]
    outputs = {}
    for feed in feeds:  # warm-up: every sample once
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
    latencies = []
    for i in range(max(1, args.runs)):
        t0 = time.perf_counter()
        session.run(None, feeds[i % len(feeds)])
        latencies.append((time.perf_counter() - t0) * 1000.0)
    print(
        json.dumps(
            {
                "model": settings["model"],
                "median_ms": round(statistics.median(latencies), 4),
                "runs": len(latencies),
                "samples": len(feeds),
                "outputs": {k: list(v.shape) for k, v in outputs.items()},
                "providers": session.get_providers(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
