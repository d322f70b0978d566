"""fp32 reference outputs, computed once per (model bytes, validation feeds) and cached by that hash.

The reference run is the first time ONNX Runtime sees the user's model, so it runs in a child
process of its own (`python -m tuner.measure.reference MODEL FEEDS OUT`), like a trial: a model
that crashes or hangs ONNX Runtime ends that child, and the caller gets one line saying so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tuner.errors import TunerError
from tuner.measure.inputs import Feed, read_feeds, save_feeds
from tuner.store.urls import env_without_credentials

if TYPE_CHECKING:
    from tuner.worker.forkserver import Child


def compute_reference(model_path: Path, feeds: list[Feed]) -> list[dict[str, np.ndarray]]:
    """Run the original model with ONNX Runtime on the CPU at basic graph optimisation (no fusions)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return [dict(zip(names, sess.run(names, feed))) for feed in feeds]


def cached_reference(cache_dir: Path, key: str, model_path: Path, feeds_path: Path, timeout_s: float) -> Path:
    """The path of the reference outputs for `key` (model hash + feeds hash), computing them in a child if missing."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"reference-{key[:32]}.npz"
    if not path.exists():
        _run_child(model_path, feeds_path, path, timeout_s)
    return path


def _run_child(model_path: Path, feeds_path: Path, out: Path, timeout_s: float) -> None:
    """Compute the reference in a process group of its own (it writes `out` atomically); one TunerError line if it
    fails. The process is forked from the study's pre-imported server where there is one (`tuner.worker.forkserver`)."""
    from tuner.worker.forkserver import REFERENCE_MODULE, start_process

    argv = [str(model_path), str(feeds_path), str(out)]
    with tempfile.TemporaryFile() as err, open(os.devnull, "wb") as devnull:
        proc = start_process(
            REFERENCE_MODULE, argv, env_without_credentials(os.environ), devnull.fileno(), err.fileno()
        )
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise TunerError(
                f"model {model_path}: the fp32 reference run with ONNX Runtime did not finish within "
                f"{timeout_s:g} s (run.trial_timeout_s); child killed"
            ) from None
        except BaseException:  # Ctrl-C or SIGTERM of the command: the child goes with it
            _kill(proc)
            raise
        err.seek(0)
        message = err.read()
    if returncode < 0:
        sig = -returncode
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        raise TunerError(
            f"model {model_path}: ONNX Runtime crashed ({name}) running the fp32 reference; the model cannot be tuned "
            "as it is"
        )
    if returncode != 0:
        lines = [line for line in message.decode(errors="replace").strip().splitlines() if line.strip()]
        raise TunerError(
            f"model {model_path}: the fp32 reference run with ONNX Runtime failed: "
            f"{lines[-1] if lines else f'exit status {returncode}'}"
        )


def _kill(proc: Child) -> None:
    """Kill the reference run's process group and wait for it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def load_reference(path: Path) -> list[dict[str, np.ndarray]]:
    """Read cached reference outputs."""
    return read_feeds(path)


def main(argv: list[str]) -> int:
    """Child entry point: MODEL FEEDS OUT; a Python error is one line on stderr and exit status 1."""
    model, feeds, out = (Path(a) for a in argv)
    try:
        save_feeds(out, compute_reference(model, read_feeds(feeds)))
    except Exception as exc:  # ONNX Runtime raises several types; the parent reports the last line
        print(f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
