"""PyTorch Inductor backend: torch.compile routes on CUDA GPUs (Triton kernels, CUDA graphs) and on the CPU.

The model is the study's ONNX file converted with onnx2torch, or the module returned by
backend.options.module = "pkg.mod:fn". "Building" a route compiles it and runs the warm-up calls
that trigger every compilation; the artifact is the Inductor cache that compilation wrote (see
`build`). Options: `device` ("auto" | "cuda" | "cpu"), `module`, and `inductor_config` (a table of
extra `torch._inductor.config` switches applied to every route). torch is imported only when the
backend is used: `import tuner` works without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from tuner.backends.base import Artifact, Backend, BuildContext, Deployment, ExportRequest, ModelInfo, Runner
from tuner.backends.device import cpu_fingerprint
from tuner.backends.inductor.space import INSTALL, OPTIONS, resolve_device
from tuner.space import Route, SearchSpace


class InductorBackend(Backend):
    """Routes over torch.compile modes, precision, memory format and Inductor configuration switches."""

    name = "inductor"
    options = OPTIONS
    requires = (("torch", INSTALL),)
    # What a CPU route's child imports before it compiles (seconds of a core in a fresh interpreter): a study's server
    # imports them once. None of them initialises CUDA; importing torch._inductor.compile_fx does (seen on an H100:
    # a process forked after it cannot use CUDA, not even the forked worker to read the device), so the child
    # imports that itself.
    preload = (
        "torch",
        "torch._dynamo",
        "torch._inductor.config",
        "onnx2torch",
        "tuner.backends.inductor.build",
        "tuner.backends.inductor.run",
    )

    def fork_safe(self, route: Route, options: Mapping[str, Any]) -> bool:
        """CPU routes; CUDA routes (`device` "cuda", or "auto" where torch sees a GPU) keep a fresh process."""
        return resolve_device(options) == "cpu"

    def version(self) -> str:
        self.check_libraries()
        parts = []
        for dist in ("torch", "onnx2torch"):
            with contextlib.suppress(metadata.PackageNotFoundError):
                parts.append(f"{dist}=={metadata.version(dist)}")
        return " ".join(parts)

    def device(self) -> dict[str, Any]:
        import torch

        out: dict[str, Any] = {**cpu_fingerprint(), "torch": torch.__version__}
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            out.update(gpu=torch.cuda.get_device_name(0), capability=f"{major}.{minor}", cuda=torch.version.cuda)
        return out

    def space(self, model: ModelInfo) -> SearchSpace:
        from tuner.backends.inductor.space import inductor_space

        return inductor_space(model)

    def build(self, route: Route, ctx: BuildContext) -> Artifact:
        from tuner.backends.inductor.build import build

        return build(route, ctx)

    def deployment(self, request: ExportRequest) -> Deployment:
        """inductor.tar (the generated code), the model, and compile_inductor.py: the torch.compile call and its
        configuration."""
        from tuner.backends.inductor.export import deployment

        return deployment(request)

    def load(self, artifact: Artifact, route: Route, ctx: BuildContext) -> Runner:
        """A runner for `artifact`: the engine its build handed over in this process, else its route recompiled from the
        shared cache."""
        from tuner.backends.inductor.build import rebuild
        from tuner.backends.inductor.engine import Engine
        from tuner.backends.inductor.run import InductorRunner

        engine = artifact.handle if isinstance(artifact.handle, Engine) else None
        if engine is None:
            engine = rebuild(artifact.path, route, ctx.model, ctx.calibration[0], ctx.work_dir, ctx.log)
        return InductorRunner(engine)
