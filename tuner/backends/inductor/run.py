"""Run an Inductor engine: inputs to the device in the route's precision and layout, outputs back as fp32.

On CUDA the runner works on the shared CUDA-event timer's non-default stream (wrapped as
`torch.cuda.ExternalStream`); host-to-device copies happen before the start event and the outputs
stay on the device, so `timed()` measures the compiled graph alone. On the CPU it uses the host clock
around the same call.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from tuner.backends.base import Feed, Runner
from tuner.backends.inductor.engine import Engine


class InductorRunner(Runner):
    """Runs an Engine; on CUDA on the CUDA-event timer's stream, timed by its events."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.timer: Any = None
        self.stream: Any = None
        if engine.device.type == "cuda":
            import torch

            from tuner.measure.gpu_timing import CudaEventTimer

            self.timer = CudaEventTimer()
            self.stream = torch.cuda.ExternalStream(self.timer.stream, device=engine.device)

    @contextlib.contextmanager
    def _on_stream(self) -> Iterator[None]:
        if self.stream is None:
            yield
            return
        import torch

        with torch.cuda.stream(self.stream):
            yield

    def infer(self, feed: Feed) -> dict[str, np.ndarray]:
        with self._on_stream():
            return self.engine.outputs(self.engine.forward(self.engine.inputs(feed)))

    def timed(self, feed: Feed) -> Callable[[], float]:
        """One call per sample; the inputs are already on the device and the outputs stay there."""
        many = self.timed_batch(feed)
        return lambda: many(1)

    def timed_batch(self, feed: Feed) -> Callable[[int], float]:
        """`n` calls enqueued back to back between one event pair (pipelined latency); inputs uploaded before."""
        with self._on_stream():
            args = self.engine.inputs(feed)
        if self.stream is not None:
            self.stream.synchronize()
        clock = self.timer.time if self.timer is not None else _host_time

        def many(n: int) -> float:
            def enqueue(_stream: int) -> None:
                with self._on_stream():
                    for _ in range(n):
                        self.engine.forward(args)

            return clock(enqueue)

        return many

    def timing_info(self) -> dict[str, Any]:
        import torch

        info = (
            self.timer.info()
            if self.timer is not None
            else {"clock": "host-perf_counter", "threads": torch.get_num_threads()}
        )
        return {
            **info,
            "torch": torch.__version__,
            "stream": "cuda-python non-blocking (ExternalStream)" if self.timer else "cpu",
        }

    def release(self) -> None:
        self.engine.synchronize()
        if self.timer is not None:
            self.timer.close()
            self.timer = self.stream = None


def _host_time(enqueue: Callable[[int], None]) -> float:
    """Seconds `enqueue(0)` took by the host clock (CPU engines compute synchronously)."""
    t0 = time.perf_counter()
    enqueue(0)
    return time.perf_counter() - t0
