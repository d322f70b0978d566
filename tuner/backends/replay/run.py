"""Run a replay artifact: recorded outputs per feed, latencies replayed from the recording on a virtual clock.

Timing a replayed engine runs the real paired measurement (`tuner.worker.timing`) against a
`VirtualClock` that only the replayed calls advance, so a trial measures in microseconds what took
seconds to record. Each runner (one process's engine, in a real study) replays one recorded round of
its route, chosen at load, from a random position onward in recorded order (the recording's own
call-to-call noise, bursts included), at the level

    true latency x (that round's level / true latency) ** drift_share

`drift_share` is the share of the recorded between-round drift that a measurement carries: 1 replays
the rounds as they were recorded (right for routes recorded paired with the default route, whose
round levels are what pairing left over); below 1 models how much of a recording's un-paired drift
would survive pairing (a recording taken un-paired cannot tell).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tuner import job as J
from tuner.backends.base import Feed, Runner
from tuner.backends.replay.build import fail_if
from tuner.backends.replay.landscape import Landscape, Point
from tuner.measure.timing import summarize


class VirtualClock:
    """Seconds of replayed inference in this process: advanced by every replayed call."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


CLOCK = VirtualClock()


class ReplayRunner(Runner):
    """Answers like the recorded engine of one round: failures are re-enacted at the first call."""

    def __init__(
        self,
        landscape: Landscape,
        point: Point,
        index: int,
        rng: np.random.Generator,
        deadline_s: float | None,
        drift_share: float = 1.0,
        in_process: bool = False,
    ) -> None:
        self.landscape = landscape
        self.point = point
        self.round = point.rounds[index]
        self.rng = rng
        self.deadline_s = deadline_s
        self.drift_share = drift_share
        self.in_process = in_process

    def _check(self) -> None:
        fail_if(self.round, "run", self.deadline_s, self.in_process)

    def infer(self, feed: Feed) -> dict[str, np.ndarray]:
        self._check()
        try:
            return dict(self.landscape.outputs_for(self.point, feed))
        except KeyError as exc:
            raise RuntimeError(f"replay: {exc.args[0]}") from exc

    def _sequence(self) -> tuple[np.ndarray, int]:
        """The replayed latencies (seconds, in recorded order) and where the replay starts."""
        statistic = str(self.landscape.meta.get("objective", {}).get("statistic", "median"))
        timed = [r for r in self.point.rounds if r.status == J.OK and r.timed]
        if not timed:
            raise RuntimeError("replay: the route has no recorded latency samples")
        j = int(self.rng.integers(len(timed)))
        samples = np.asarray(timed[j].samples_ms, dtype=np.float64)
        level = self.landscape.levels(self.point, statistic)[j]
        true = self.landscape.true_ms(self.point, statistic) or level
        scale = true * math.exp(self.drift_share * math.log(level / true)) / summarize(samples).get(statistic)
        return samples * scale / 1000.0, int(self.rng.integers(samples.size))

    def timed(self, feed: Feed) -> Callable[[], float]:
        self._check()
        seconds, start = self._sequence()
        position = [start]

        def once() -> float:
            s = float(seconds[position[0] % seconds.size])
            position[0] += 1
            CLOCK.now += s
            return s

        return once

    def timed_batch(self, feed: Feed) -> Callable[[int], float]:
        once = self.timed(feed)
        return lambda n: sum(once() for _ in range(n))

    def clock(self) -> float:
        return CLOCK()

    def timing_info(self) -> dict[str, str | bool]:
        return {"clock": "cuda-event" if self.landscape.on_gpu() else "replayed-recording", "replayed": True}
