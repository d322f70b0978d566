"""fp32 reference outputs, computed once per (model bytes, validation feeds) and cached by that hash."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tuner.measure.inputs import Feed, read_feeds, save_feeds


def compute_reference(model_path: Path, feeds: list[Feed]) -> list[dict[str, np.ndarray]]:
    """Run the original model with ONNX Runtime on the CPU at basic graph optimisation (no fusions)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return [dict(zip(names, sess.run(names, feed))) for feed in feeds]


def cached_reference(cache_dir: Path, key: str, model_path: Path, feeds: list[Feed]) -> Path:
    """The path of the reference outputs for `key` (model hash + feeds hash), computing them if missing."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"reference-{key[:32]}.npz"
    if not path.exists():
        save_feeds(path, compute_reference(model_path, feeds))
    return path


def load_reference(path: Path) -> list[dict[str, np.ndarray]]:
    """Read cached reference outputs."""
    return read_feeds(path)
