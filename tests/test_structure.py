"""Structural guarantees: the runner lifecycle, and (below) the shape of the code itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuner import job as J
from tuner.backends import get_backend
from tuner.backends.base import Feed, ModelInfo, Runner
from tuner.measure.inputs import save_feeds
from tuner.measure.reference import compute_reference
from tuner.worker.child import run_job


class Counting(Runner):
    """A runner that counts its releases and can fail to release."""

    def __init__(self, fail_release: bool = False) -> None:
        self.releases = 0
        self.fail_release = fail_release

    def infer(self, feed: Feed) -> dict[str, np.ndarray]:
        return {}

    def release(self) -> None:
        self.releases += 1
        if self.fail_release:
            raise OSError("device gone")


def test_runner_closes_once_also_when_the_block_raises() -> None:
    with Counting() as ok:
        pass
    ok.close()
    assert ok.closed and ok.releases == 1
    failing = Counting()
    with pytest.raises(ValueError, match="in the block"):
        with failing:
            raise ValueError("in the block")
    assert failing.releases == 1
    both = Counting(fail_release=True)
    with pytest.raises(ValueError) as info:
        with both:
            raise ValueError("in the block")
    assert "closing the runner afterwards failed too: OSError: device gone" in info.value.__notes__
    with pytest.raises(OSError, match="device gone"):
        with Counting(fail_release=True):
            pass


def _job(tmp_path: Path, model: Path, tolerance: float, options: dict[str, Any]) -> J.Job:
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(3)]
    save_feeds(tmp_path / "feeds.npz", feeds)
    save_feeds(tmp_path / "ref.npz", compute_reference(model, feeds))
    route = get_backend("onnxruntime").space(ModelInfo(model, {"x": (1, 3, 16, 16)})).default_route()
    return J.Job(backend="tests.backends:ClosingBackend", route=route, model_path=str(model), input_shapes={"x": [1, 3, 16, 16]},
                 options=options, work_dir=str(tmp_path / "work"), out_dir=str(tmp_path / "out"),
                 feeds_path=str(tmp_path / "feeds.npz"), reference_path=str(tmp_path / "ref.npz"), metric="cosine",
                 tolerance=tolerance, atol=1e-3, rtol=1e-3, gate_samples=1, warmup_s=0.0, min_repeats=2, min_duration_s=0.0,
                 timeout_s=60)


@pytest.mark.parametrize(("tolerance", "options", "status"), [
    (1e-3, {}, J.OK), (-1.0, {}, J.GATE_FAILED), (1e-3, {"fail_infer": True}, J.RUNTIME_ERROR)])
def test_the_trial_closes_its_runner_on_every_path(tmp_path: Path, tiny_model: Path, tolerance: float, options: dict[str, Any], status: str) -> None:
    job = _job(tmp_path, tiny_model, tolerance, options)
    res = run_job(job, tmp_path / "result.json")
    assert res.status == status, res.message
    assert (Path(job.out_dir) / "closed").read_text() == "closed\n"  # exactly once
    assert set(res.phase_s) == ({"build", "load", "gate"} if status != J.OK else {"build", "load", "gate", "time", "accuracy"})
