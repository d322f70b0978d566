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
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.backends.base import Artifact, BuildContext, Feed, Runner
from tuner.space import Route

DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass
class Engine:
    """A compiled module with the route's device, precision and memory format."""

    fn: Callable[..., Any]
    device: Any  # torch.device
    dtype: Any  # torch.dtype of floating inputs and weights
    tf32: bool
    channels_last: bool
    input_names: list[str]
    output_names: list[str]
    options: dict[str, Any]

    @classmethod
    def create(cls, module: Any, route: Route, device: str, input_names: list[str], output_names: list[str], options: dict[str, Any]) -> Engine:
        """Move `module` to the device, precision and layout of `route` and wrap it in torch.compile."""
        import torch

        dtype = getattr(torch, DTYPES[str(route["precision"])])
        channels_last = bool(route.get("channels_last", False))
        module = module.to(device=device, dtype=dtype)
        if channels_last:
            module = module.to(memory_format=torch.channels_last)
        compiled = torch.compile(module, options=options)
        return cls(compiled, torch.device(device), dtype, route["precision"] == "tf32", channels_last, input_names, output_names, options)

    @property
    def device_name(self) -> str:
        """The device's name (GPU model or 'cpu')."""
        import torch

        return torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"

    def _flags(self) -> None:
        """Set the process-wide TF32 switches this engine was compiled for (several engines may share a process)."""
        import torch

        torch.backends.cuda.matmul.allow_tf32 = self.tf32
        torch.backends.cudnn.allow_tf32 = self.tf32

    def inputs(self, feed: Feed) -> list[Any]:
        """The feed as device tensors in the engine's dtype and memory format, in model input order."""
        import torch

        out = []
        for name in self.input_names:
            t = torch.from_numpy(np.ascontiguousarray(feed[name])).to(self.device)
            if t.is_floating_point():
                t = t.to(self.dtype)
            if self.channels_last and t.dim() == 4:
                t = t.contiguous(memory_format=torch.channels_last)
            out.append(t)
        return out

    def forward(self, args: list[Any]) -> Any:
        """One call of the compiled module (asynchronous on CUDA)."""
        import torch

        self._flags()
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():
            return self.fn(*args)

    def outputs(self, result: Any) -> dict[str, np.ndarray]:
        """The module's result as host arrays keyed by the ONNX output names (floating outputs as fp32)."""
        import torch

        if isinstance(result, torch.Tensor):
            tensors = [result]
        elif isinstance(result, dict):
            tensors = [result[n] for n in self.output_names] if set(self.output_names) <= set(result) else list(result.values())
        else:
            tensors = list(result)
        if len(tensors) != len(self.output_names):
            raise RuntimeError(f"the module returned {len(tensors)} outputs; the ONNX model has {len(self.output_names)}")
        return {n: (t.float() if t.is_floating_point() else t).detach().cpu().numpy() for n, t in zip(self.output_names, tensors)}

    def synchronize(self) -> None:
        """Wait for the device."""
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


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
        with self._on_stream():
            args = self.engine.inputs(feed)
        if self.stream is not None:
            self.stream.synchronize()

        def enqueue(_stream: int) -> None:
            with self._on_stream():
                self.engine.forward(args)

        clock = self.timer.time if self.timer is not None else _host_time
        return lambda: clock(enqueue)

    def timing_info(self) -> dict[str, Any]:
        import torch

        info = self.timer.info() if self.timer is not None else {"clock": "host-perf_counter", "threads": torch.get_num_threads()}
        return {**info, "torch": torch.__version__, "stream": "cuda-python non-blocking (ExternalStream)" if self.timer else "cpu"}

    def close(self) -> None:
        self.engine.synchronize()
        if self.timer is not None:
            self.timer.close()
            self.timer = self.stream = None


def _host_time(enqueue: Callable[[int], None]) -> float:
    """Seconds `enqueue(0)` took by the host clock (CPU engines compute synchronously)."""
    t0 = time.perf_counter()
    enqueue(0)
    return time.perf_counter() - t0


def load(artifact: Artifact, route: Route, ctx: BuildContext) -> Runner:
    """A runner for `artifact`: the engine built in this process, else its route recompiled from the shared cache."""
    from tuner.backends.inductor.build import BUILT, rebuild

    engine = BUILT.pop(str(artifact.path), None)
    if engine is None:
        engine = rebuild(artifact.path, route, ctx.model, ctx.calibration[0], ctx.work_dir, ctx.log)
    return InductorRunner(engine)
