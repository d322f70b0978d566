"""The CUDA runtime calls the TensorRT backend needs, through cuda-python (`cuda.bindings.runtime`).

Every cuda-python call returns `(error, *values)`; `call` checks the error and returns the values.
Imported lazily (only in the trial's child process on a GPU machine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


def cudart() -> Any:
    """The cuda-python runtime module."""
    from cuda.bindings import runtime

    return runtime


def call(result: Any, what: str) -> Any:
    """The values of a cuda-python result tuple; RuntimeError naming `what` on a CUDA error."""
    rt = cudart()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != rt.cudaError_t.cudaSuccess:
        _, name = rt.cudaGetErrorName(err)
        raise RuntimeError(f"{what}: {name.decode() if isinstance(name, bytes) else name}")
    return values[0] if len(values) == 1 else tuple(values) or None


@dataclass(frozen=True)
class DeviceFacts:
    """What a build needs to know about the current GPU."""

    l2_bytes: int
    free_bytes: int


def device_facts() -> DeviceFacts:
    """L2 size and free memory of the current device."""
    rt = cudart()
    device = call(rt.cudaGetDevice(), "cudaGetDevice")
    l2 = call(rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute")
    free, _total = call(rt.cudaMemGetInfo(), "cudaMemGetInfo")
    return DeviceFacts(int(l2), int(free))


class DeviceArray:
    """A device allocation mirroring a host array's bytes; copies are synchronous (outside timing)."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.nbytes = max(1, int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize)
        self.ptr = int(call(cudart().cudaMalloc(self.nbytes), "cudaMalloc"))

    def upload(self, host: np.ndarray) -> None:
        """Copy `host` (same shape and dtype) to the device."""
        data = np.ascontiguousarray(host, dtype=self.dtype)
        rt = cudart()
        call(
            rt.cudaMemcpy(self.ptr, data.ctypes.data, data.nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice),
            "cudaMemcpy H2D",
        )

    def download(self) -> np.ndarray:
        """The device bytes as a new host array."""
        out = np.empty(self.shape, self.dtype)
        rt = cudart()
        call(
            rt.cudaMemcpy(out.ctypes.data, self.ptr, out.nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost),
            "cudaMemcpy D2H",
        )
        return out

    def free(self) -> None:
        """Release the allocation (idempotent)."""
        if self.ptr:
            call(cudart().cudaFree(self.ptr), "cudaFree")
            self.ptr = 0


class Graph:
    """A CUDA graph captured from one enqueue on `stream`, replayed by `launch`."""

    def __init__(self, stream: int, enqueue: Any) -> None:
        rt = cudart()
        call(
            rt.cudaStreamBeginCapture(stream, rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal),
            "cudaStreamBeginCapture",
        )
        try:
            enqueue(stream)
        finally:
            graph = call(rt.cudaStreamEndCapture(stream), "cudaStreamEndCapture")
        self.graph = graph
        self.exec = call(rt.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")

    def launch(self, stream: int) -> None:
        """Replay the graph on `stream`."""
        call(cudart().cudaGraphLaunch(self.exec, stream), "cudaGraphLaunch")

    def destroy(self) -> None:
        """Release the graph and its executable."""
        rt = cudart()
        call(rt.cudaGraphExecDestroy(self.exec), "cudaGraphExecDestroy")
        call(rt.cudaGraphDestroy(self.graph), "cudaGraphDestroy")
