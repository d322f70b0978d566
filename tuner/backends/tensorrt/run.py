"""Run a TensorRT engine: verified deserialization, device buffers, execute_async_v3, optional CUDA graph.

Transfers stay outside the timed region: `timed` uploads the inputs once, then times only the
enqueue (or graph launch) with CUDA events on a non-default stream.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from tuner.backends.base import Artifact, Feed, Runner, RuntimeRefused
from tuner.backends.tensorrt.build import logged_errors, make_logger
from tuner.backends.tensorrt.cuda import DeviceArray, Graph
from tuner.backends.tensorrt.version import TrtApi

# DataType member names -> numpy dtypes for I/O tensors (our variants keep fp32 I/O; see keep_io_types).
DTYPES = {
    "FLOAT": np.float32,
    "HALF": np.float16,
    "INT32": np.int32,
    "INT64": np.int64,
    "INT8": np.int8,
    "UINT8": np.uint8,
    "BOOL": np.bool_,
}


def verified_bytes(artifact: Artifact) -> bytes:
    """The engine bytes, refused unless their sha256 matches the one recorded when they were built."""
    data = artifact.path.read_bytes()
    expected = artifact.info.get("sha256")
    if expected and hashlib.sha256(data).hexdigest() != expected:
        raise RuntimeError(
            f"{artifact.path.name}: sha256 differs from the recorded {str(expected)[:16]}...; not deserializing it"
        )
    return data


class TrtRunner(Runner):
    """An execution context over a deserialized engine, with one device buffer per I/O tensor."""

    def __init__(self, api: TrtApi, artifact: Artifact, use_cuda_graph: bool = True) -> None:
        trt = api.trt
        self.api, self.use_cuda_graph = api, use_cuda_graph
        self.logger = make_logger(trt)
        runtime = trt.Runtime(self.logger)
        data = verified_bytes(artifact)
        try:
            engine = runtime.deserialize_cuda_engine(data)
        except Exception as exc:  # the bindings raise on some refusals instead of returning None
            raise RuntimeRefused(f"{api.label} refused to deserialize the engine: {type(exc).__name__}: {exc}") from exc
        if engine is None:
            raise RuntimeRefused(
                f"{api.label} refused to deserialize the engine on this GPU: "
                f"{logged_errors(self.logger) or 'no error logged'}"
            )
        context = engine.create_execution_context()
        if context is None:
            raise RuntimeRefused(
                f"{api.label} could not create an execution context: {logged_errors(self.logger) or 'no error logged'}"
            )
        self.runtime, self.engine, self.context = runtime, engine, context
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.dtypes = {n: self._dtype(engine.get_tensor_dtype(n)) for n in names}
        self.buffers: dict[str, DeviceArray] = {}
        self.graph: Graph | None = None
        self.graph_error = ""
        self.timer: Any = None

    def _dtype(self, trt_dtype: Any) -> Any:
        name = str(trt_dtype).rsplit(".", 1)[-1]
        if name not in DTYPES:
            raise RuntimeError(f"I/O tensor type {name} has no numpy equivalent here")
        return DTYPES[name]

    def _bind(self, feed: Feed) -> None:
        """Shape the context for `feed`, (re)allocate buffers, upload inputs, set every tensor address."""
        context = self.context
        for name in self.inputs:
            context.set_input_shape(name, tuple(feed[name].shape))
        shapes = {n: tuple(feed[n].shape) for n in self.inputs} | {
            n: tuple(context.get_tensor_shape(n)) for n in self.outputs
        }
        for name, shape in shapes.items():
            buf = self.buffers.get(name)
            if buf is None or buf.shape != shape:
                if buf is not None:
                    buf.free()
                self.buffers[name] = DeviceArray(shape, self.dtypes[name])
            context.set_tensor_address(name, self.buffers[name].ptr)
        for name in self.inputs:
            self.buffers[name].upload(feed[name])

    def _enqueue(self, stream: int) -> None:
        if not self.context.execute_async_v3(stream):
            raise RuntimeError("execute_async_v3 returned False")

    def _stream_timer(self) -> Any:
        if self.timer is None:
            from tuner.measure.gpu_timing import CudaEventTimer

            self.timer = CudaEventTimer()
        return self.timer

    def infer(self, feed: Feed) -> dict[str, np.ndarray]:
        timer = self._stream_timer()
        self._bind(feed)
        timer.time(self._enqueue)  # synchronizes the stream before returning
        return {name: self.buffers[name].download() for name in self.outputs}

    def timed(self, feed: Feed) -> Callable[[], float]:
        """One enqueue (or CUDA-graph launch) timed with CUDA events; inputs uploaded once, before."""
        many = self.timed_batch(feed)
        return lambda: many(1)

    def timed_batch(self, feed: Feed) -> Callable[[int], float]:
        """`n` enqueues (or graph launches) back to back between one event pair (pipelined latency)."""
        timer = self._stream_timer()
        self._bind(feed)
        timer.time(self._enqueue)  # the first enqueue does deferred allocations; capture after it
        launch = self._enqueue
        if self.use_cuda_graph and self.graph is None:
            try:
                self.graph = Graph(timer.stream, self._enqueue)
            except RuntimeError as exc:  # some engines cannot be captured; time plain enqueues then
                self.graph_error = str(exc)
        if self.graph is not None:
            launch = self.graph.launch

        def many(n: int) -> float:
            def enqueue(stream: int) -> None:
                for _ in range(n):
                    launch(stream)

            return float(timer.time(enqueue))

        return many

    def timing_info(self) -> dict[str, Any]:
        info = dict(self.timer.info()) if self.timer is not None else {}
        return {
            **info,
            "clock": "cuda-events",
            "engine_runtime": self.api.label,
            "cuda_graph": self.graph is not None,
            **({"cuda_graph_error": self.graph_error} if self.graph_error else {}),
        }

    def release(self) -> None:
        if self.graph is not None:
            self.graph.destroy()
            self.graph = None
        for buf in self.buffers.values():
            buf.free()
        self.buffers.clear()
        if self.timer is not None:
            self.timer.close()
            self.timer = None
