"""Run a replay artifact: recorded outputs per feed, latencies drawn from the recorded samples."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tuner.backends.base import Feed, Runner
from tuner.backends.replay.build import fail_if
from tuner.backends.replay.landscape import Landscape, Point


class ReplayRunner(Runner):
    """Answers like the recorded engine of one round: failures are re-enacted at the first call.

    `timed` draws with replacement from that round's samples, so the statistic of a timing run is
    the statistic of a bootstrap resample of the recording: noise as measured, seeded per trial.
    """

    simulated = True

    def __init__(self, landscape: Landscape, point: Point, index: int, rng: np.random.Generator, deadline_s: float | None) -> None:
        self.landscape = landscape
        self.point = point
        self.round = point.rounds[index]
        self.rng = rng
        self.deadline_s = deadline_s

    def _check(self) -> None:
        fail_if(self.round, "run", self.deadline_s)

    def infer(self, feed: Feed) -> dict[str, np.ndarray]:
        self._check()
        try:
            return dict(self.landscape.outputs_for(self.point, feed))
        except KeyError as exc:
            raise RuntimeError(f"replay: {exc.args[0]}") from exc

    def timed(self, feed: Feed) -> Callable[[], float]:
        self._check()
        samples = np.asarray(self.round.samples_ms, dtype=np.float64) / 1000.0
        if not samples.size:
            raise RuntimeError("replay: the recorded round has no latency samples")

        def once() -> float:
            return float(samples[self.rng.integers(samples.size)])

        return once

    def timing_info(self) -> dict[str, str]:
        return {"clock": "replayed-recording"}
