"""Device-side latency: CUDA events on a dedicated stream, through cuda-python (`cuda.bindings.runtime`).

Shared by every GPU runner (TensorRT, Inductor). A runner enqueues one inference on `timer.stream`
inside `timer.time(enqueue)`; the elapsed time between the two events is what the GPU spent on that
work, including any gaps while the host was still launching it, and excluding host-side transfers
done before or after. `info()` records what the measurement depends on: GPU, clocks, versions.

cuda-python and nvidia-ml-py are imported lazily, so this module imports on machines without them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

DRIVER_LIBRARY = "libcuda.so"  # a process with a CUDA context has it mapped


class GpuTimingError(RuntimeError):
    """CUDA events cannot be used here (no cuda-python, no GPU, or a CUDA call failed)."""


def _runtime() -> Any:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError as exc:
        raise GpuTimingError("GPU timing needs cuda-python (pip install 'cuda-python>=12.6')") from exc
    return cudart


class CudaEventTimer:
    """A non-default stream and a start/end event pair on the current CUDA device."""

    def __init__(self) -> None:
        self._rt = _runtime()
        rt = self._rt
        self._stream = self._start = self._end = None
        self._device = int(self._check(rt.cudaGetDevice(), "cudaGetDevice"))
        self._stream = self._check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "cudaStreamCreateWithFlags")
        self._start = self._check(rt.cudaEventCreate(), "cudaEventCreate")
        self._end = self._check(rt.cudaEventCreate(), "cudaEventCreate")

    def _check(self, result: tuple[Any, ...], call: str) -> Any:
        """Unpack a cuda-python result tuple, raising GpuTimingError on an error code."""
        err, *values = result
        if err != self._rt.cudaError_t.cudaSuccess:
            _, text = self._rt.cudaGetErrorString(err)
            raise GpuTimingError(f"{call} failed: {getattr(err, 'name', err)} ({_text(text)})")
        return values[0] if len(values) == 1 else tuple(values) or None

    @property
    def stream(self) -> int:
        """The stream handle (a cudaStream_t as an integer) that work must be enqueued on."""
        return int(self._stream)

    def time(self, enqueue: Callable[[int], None]) -> float:
        """Seconds the GPU took for the work `enqueue(stream)` put on the stream (synchronizes)."""
        rt = self._rt
        self._check(rt.cudaEventRecord(self._start, self._stream), "cudaEventRecord")
        enqueue(self.stream)
        self._check(rt.cudaEventRecord(self._end, self._stream), "cudaEventRecord")
        self._check(rt.cudaEventSynchronize(self._end), "cudaEventSynchronize")
        return float(self._check(rt.cudaEventElapsedTime(self._start, self._end), "cudaEventElapsedTime")) / 1000.0

    def info(self) -> dict[str, Any]:
        """The GPU's name and PCI bus id, driver/runtime versions and, where NVML answers, its clocks now."""
        rt = self._rt
        props = self._check(rt.cudaGetDeviceProperties(self._device), "cudaGetDeviceProperties")
        bus_id = _text(self._check(rt.cudaDeviceGetPCIBusId(32, self._device), "cudaDeviceGetPCIBusId"))
        out: dict[str, Any] = {
            "clock": "cuda-event",
            "gpu": _text(props.name),
            "compute_capability": f"{props.major}.{props.minor}",
            "pci_bus_id": bus_id,
            "cuda_driver": _version(self._check(rt.cudaDriverGetVersion(), "cudaDriverGetVersion")),
            "cuda_runtime": _version(self._check(rt.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion")),
        }
        out.update(_nvml_clocks(bus_id))
        return out

    def close(self) -> None:
        """Destroy the events and the stream (idempotent)."""
        rt = self._rt
        for event in (self._start, self._end):
            if event is not None:
                rt.cudaEventDestroy(event)
        if self._stream is not None:
            rt.cudaStreamDestroy(self._stream)
        self._start = self._end = self._stream = None


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode(errors="replace")
    return str(value)


def _version(code: int) -> str:
    """CUDA's integer version (e.g. 13000) as 'major.minor'."""
    return f"{code // 1000}.{(code % 1000) // 10}"


def _nvml_clocks(bus_id: str) -> dict[str, Any]:
    """SM/memory clocks (current and maximum, MHz), power state and driver version from NVML.

    Each reading is taken on its own, so one query a virtualised GPU refuses loses only that field;
    when NVML cannot be used at all, `nvml` says why.
    """
    try:
        import pynvml
    except ImportError:
        return {"nvml": "nvidia-ml-py is not installed"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return {"nvml": f"unavailable: {exc}"}
    try:
        by_bus = getattr(pynvml, "nvmlDeviceGetHandleByPciBusId_v2", None) or pynvml.nvmlDeviceGetHandleByPciBusId
        handle = by_bus(bus_id.encode())
        readings: dict[str, Callable[[], Any]] = {
            "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "sm_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "pstate": lambda: int(pynvml.nvmlDeviceGetPerformanceState(handle)),
            "nvidia_driver": lambda: _text(pynvml.nvmlSystemGetDriverVersion()),
        }
        out: dict[str, Any] = {}
        for key, read in readings.items():
            try:
                out[key] = read()
            except pynvml.NVMLError:
                continue
        return out
    except Exception as exc:  # clocks are context for a measurement; never fail one over them
        return {"nvml": f"no reading for {bus_id}: {type(exc).__name__}: {exc}"}
    finally:
        pynvml.nvmlShutdown()


def device_memory_used() -> int | None:
    """Bytes in use on the current CUDA device, or None where this process has no current CUDA context.

    Asks the driver for the current context first (`cuCtxGetCurrent`), so a process that never used
    the GPU is not made to: no context is created here. None also without cuda-python or a driver, and
    at once where the driver library is not loaded in this process (no context can exist; a CPU
    trial's child is not made to import cuda-python, tens of milliseconds of its start).
    """
    if not _driver_loaded():
        return None
    try:
        from cuda.bindings import driver
        from cuda.bindings import runtime as cudart

        err, context = driver.cuCtxGetCurrent()
        if err != driver.CUresult.CUDA_SUCCESS or not int(context):
            return None
        err, free, total = cudart.cudaMemGetInfo()
    except Exception:  # no cuda-python, no driver library (it raises its own loader errors): nothing to read
        return None
    return int(total - free) if err == cudart.cudaError_t.cudaSuccess else None


def _driver_loaded() -> bool:
    """Whether the CUDA driver library is mapped into this process (`/proc/self/maps`; True if that is unreadable)."""
    try:
        return DRIVER_LIBRARY in Path("/proc/self/maps").read_text()
    except OSError:
        return True
