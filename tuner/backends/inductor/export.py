"""Inductor's native reproduction of a trial: a Python snippet with the torch.compile call and its Inductor
configuration.

`compile_inductor.py` compiles the study's module as the trial did (`Engine.create`): the device,
dtype and memory format of the route, TF32 on or off, and `torch.compile(module, dynamic=False, options=OPTIONS)`
with the Inductor configuration the build recorded (its compile mode's settings, its switches and the
study's `inductor_config`), once for each input shape the trial was measured at (`SHAPES`: the
`[[objective.shapes]]`, else the `[model]` shapes). The artifact, `inductor.tar`, is the code Inductor
generated then.
"""

from __future__ import annotations

import pprint
from pathlib import Path
from typing import Any

from tuner.backends.base import Deployment, ExportRequest
from tuner.backends.inductor.engine import DTYPES
from tuner.backends.inductor.space import MODULE

SCRIPT, MODEL = "compile_inductor.py", "model.onnx"

TEMPLATE = '''#!/usr/bin/env python3
"""Compile the exported route with torch.compile as it was measured ({version}, on {device}).

    python3 compile_inductor.py    (compiles the module for each measured shape and runs it once on zeros)

`compiled(shapes)` returns the module compiled for inputs of `shapes` (one of SHAPES) with this route's
Inductor configuration; inductor.tar holds the code Inductor generated for each shape when it was measured
(one module per graph), to compare with.
"""

import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# torch._inductor.config for this route: its compile mode's settings, its switches, the study's inductor_config.
OPTIONS = {options}
DEVICE = {device_type!r}
DTYPE = torch.{dtype}
CHANNELS_LAST = {channels_last!r}
TF32 = {tf32!r}
INPUTS = {inputs}  # name -> dtype
# The input shapes measured (name -> shape): the trial compiled one module for each.
SHAPES = {shapes}


def zeros(shapes):
    """Zero inputs of `shapes` (name -> shape) in the model's dtypes, on the CPU, in the model's input order."""
    return [torch.zeros(shapes[name], dtype=getattr(torch, dtype)) for name, dtype in INPUTS.items()]


def source(shapes):
    """The eager module the study tuned, for inputs of `shapes`."""
{source}


def compiled(shapes=SHAPES[0]):
    """The module on the route's device, precision and memory format, compiled for inputs of `shapes` as the trial
    compiled it."""
    module = source(shapes).eval().to(device=DEVICE, dtype=DTYPE)
    if CHANNELS_LAST:
        module = module.to(memory_format=torch.channels_last)
    torch.backends.cuda.matmul.allow_tf32 = TF32
    torch.backends.cudnn.allow_tf32 = TF32
    return torch.compile(module, dynamic=False, options=OPTIONS)


if __name__ == "__main__":
    for shapes in SHAPES:
        args = [t.to(DEVICE, DTYPE) if t.is_floating_point() else t.to(DEVICE) for t in zeros(shapes)]
        with torch.no_grad():
            out = compiled(shapes)(*args)
        outs = [out] if isinstance(out, torch.Tensor) else list(out.values()) if isinstance(out, dict) else list(out)
        print([list(o.shape) for o in outs])
'''

ONNX_SOURCE = """    from onnx2torch import convert

    module = convert(os.path.join(HERE, "{model}"))
    try:  # the tuner fixed onnx2torch's Reshape/Pad arguments to each measured shape, so Dynamo traces them whole
        from tuner.backends.inductor.build import static_shapes
    except ImportError:
        return module
    return static_shapes(module, [t.numpy() for t in zeros(shapes)])"""

FUNCTION_SOURCE = """    from {module_name} import {function}

    return {function}()[0]  # backend.options.module: (torch.nn.Module, example inputs)"""


def measured_shapes(request: ExportRequest) -> list[dict[str, list[int]]]:
    """The input shapes the trial was measured (and compiled) at, each name -> shape in the model's input order."""
    return [{n: list(s["inputs"][n]) for n in request.inputs} for s in request.shapes] or [
        {n: list(i["shape"]) for n, i in request.inputs.items()}
    ]


def deployment(request: ExportRequest) -> Deployment:
    """inductor.tar (the generated code), model.onnx and compile_inductor.py."""
    route, info = request.route, request.build_info
    target = str(MODULE.get(request.model.options))
    if target:
        module_name, _, function = target.partition(":")
        source = FUNCTION_SOURCE.format(module_name=module_name, function=function)
    else:
        source = ONNX_SOURCE.format(model=MODEL)
    device = str(info.get("device", "cpu"))
    options: Any = info.get("options", {})
    text = TEMPLATE.format(
        version=request.backend_version or "torch",
        device=device,
        options=pprint.pformat(options, indent=4, sort_dicts=True),
        device_type="cpu" if device == "cpu" else "cuda",
        dtype=DTYPES[str(route["precision"])],
        channels_last=bool(route.get("channels_last", False)),
        tf32=route["precision"] == "tf32",
        inputs={name: i["dtype"] for name, i in request.inputs.items()},
        shapes=pprint.pformat(measured_shapes(request), indent=4, sort_dicts=False),
        source=source,
    )
    files: dict[str, str | bytes | Path] = {SCRIPT: text}
    if not target:
        files[MODEL] = request.model.path
    pins = request.backend_version or "torch onnx2torch"  # e.g. "torch==2.11.0 onnx2torch==1.5.15"
    return Deployment(
        artifact_name="inductor.tar",
        files=files,
        executables=(SCRIPT,),
        about={
            SCRIPT: "the torch.compile call and the Inductor configuration the route was measured with",
            MODEL: "the study's model, converted to torch by onnx2torch as the tuner did",
        },
        commands=[f"python3 {SCRIPT}"],
        needs=f"python3 with {pins} (pip install {pins})" + (f"; and {target}'s package" if target else ""),
        run="`from compile_inductor import compiled` gives the compiled module: `compiled(shapes)` for inputs of one "
        "of its `SHAPES`; `inductor.tar` is the code Inductor generated for them when it was measured "
        f"({info.get('graphs', '?')} graph(s), code sha256 {str(info.get('code_sha256', ''))[:12]}).",
        notes=[
            "Inductor compiles on first use and may choose other kernels on another machine or torch version "
            "(autotuning): compare its generated code with inductor.tar."
        ],
    )
