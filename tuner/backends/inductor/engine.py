"""Compiled Inductor modules with their route's device, precision and memory format (built by `build`, run by `run`).

An engine holds one compiled module per input shape it serves (`ModelInfo.served`), each specialised to
its shape (`dynamic=False`); a call goes to the module compiled for the call's input shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.backends.base import Feed
from tuner.space import Route

DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}
Shapes = tuple[tuple[int, ...], ...]  # one shape per model input, in input order


def shapes_of(args: list[Any]) -> Shapes:
    """The shapes of a call's arguments (arrays or tensors), in order."""
    return tuple(tuple(a.shape) for a in args)


@dataclass
class Engine:
    """Compiled modules, one per served input shape, with the route's device, precision and memory format."""

    fns: dict[Shapes, Callable[..., Any]]  # input shapes -> the module compiled for them
    device: Any  # torch.device
    dtype: Any  # torch.dtype of floating inputs and weights
    tf32: bool
    channels_last: bool
    input_names: list[str]
    output_names: list[str]
    options: dict[str, Any]

    @classmethod
    def create(
        cls,
        modules: Mapping[Shapes, Any],
        route: Route,
        device: str,
        input_names: list[str],
        output_names: list[str],
        options: dict[str, Any],
    ) -> Engine:
        """Move each module (keyed by the input shapes it serves) to the device, precision and layout of `route` and
        wrap it in torch.compile, specialised to its shapes."""
        import torch

        dtype = getattr(torch, DTYPES[str(route["precision"])])
        channels_last = bool(route.get("channels_last", False))
        # Dynamo keeps at most `recompile_limit` compiled frames per code object, and each module here may add one to
        # the same one (a backend.options.module module's forward, at every shape and in every engine of the process)
        torch._dynamo.config.recompile_limit += len(modules)
        fns = {}
        for shapes, module in modules.items():
            module = module.to(device=device, dtype=dtype)
            if channels_last:
                module = module.to(memory_format=torch.channels_last)
            fns[shapes] = torch.compile(module, dynamic=False, options=options)
        return cls(
            fns,
            torch.device(device),
            dtype,
            route["precision"] == "tf32",
            channels_last,
            input_names,
            output_names,
            options,
        )

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
            t = torch.from_numpy(np.asarray(feed[name], order="C")).to(self.device)  # keeps a scalar 0-D
            if t.is_floating_point():
                t = t.to(self.dtype)
            if self.channels_last and t.dim() == 4:
                t = t.contiguous(memory_format=torch.channels_last)
            out.append(t)
        return out

    def forward(self, args: list[Any]) -> Any:
        """One call of the module compiled for the arguments' shapes (asynchronous on CUDA)."""
        import torch

        fn = self.fns.get(shapes_of(args))
        if fn is None:
            served = " or ".join(str(list(k)) for k in self.fns)
            raise RuntimeError(f"no module was compiled for input shapes {list(shapes_of(args))}; compiled: {served}")
        self._flags()
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():
            return fn(*args)

    def outputs(self, result: Any) -> dict[str, np.ndarray]:
        """The module's result as host arrays keyed by the ONNX output names (floating outputs as fp32)."""
        import torch

        if isinstance(result, torch.Tensor):
            tensors = [result]
        elif isinstance(result, dict):
            tensors = (
                [result[n] for n in self.output_names]
                if set(self.output_names) <= set(result)
                else list(result.values())
            )
        else:
            tensors = list(result)
        if len(tensors) != len(self.output_names):
            raise RuntimeError(
                f"the module returned {len(tensors)} outputs; the ONNX model has {len(self.output_names)}"
            )
        return {
            n: (t.float() if t.is_floating_point() else t).detach().cpu().numpy()
            for n, t in zip(self.output_names, tensors)
        }

    def synchronize(self) -> None:
        """Wait for the device."""
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
