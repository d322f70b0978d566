"""The Inductor route space: compile mode, precision, memory format and Inductor configuration switches.

Every switch is a key of `torch._inductor.config` and is offered only when the installed torch has
it; its default is that torch's own default, so the default route is plain `torch.compile`. A switch
that the chosen compile mode already sets (e.g. `coordinate_descent_tuning` under max-autotune) is
inactive for that mode. CUDA graphs are chosen through the mode (reduce-overhead, max-autotune).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner import job as J
from tuner.backends.base import BuildError, ModelInfo, Option
from tuner.errors import TunerError, require
from tuner.space import Param, SearchSpace
from tuner.space.params import Value

INSTALL = "pip install 'route-tuner[inductor]'"  # torch and onnx2torch
MODES_CUDA = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
MODES_CPU = ("default", "max-autotune-no-cudagraphs")
PRECISIONS_CUDA = ("fp32", "tf32", "bf16", "fp16")
PRECISIONS_CPU = ("fp32", "bf16", "fp16")


class UnknownSwitch(BuildError):
    """An Inductor configuration name or value that the installed torch does not accept."""

    failure_class = J.UNKNOWN_SWITCH


@dataclass(frozen=True)
class Switch:
    """One `torch._inductor.config` key offered as a route knob."""

    name: str  # the route parameter
    key: str  # the torch._inductor.config key
    alternatives: tuple[Value, ...]  # offered besides torch's default
    help: str
    cuda_only: bool = False
    needs_autotune: bool = False  # only matters when max_autotune is on


SWITCHES: tuple[Switch, ...] = (
    Switch("epilogue_fusion", "epilogue_fusion", (True, False), "fuse pointwise ops into GEMM/conv epilogues"),
    Switch("aggressive_fusion", "aggressive_fusion", (False, True), "fuse nodes even without shared memory reads"),
    Switch("max_fusion_size", "max_fusion_size", (16, 64, 256), "most nodes one fused kernel may hold"),
    Switch(
        "pattern_matcher",
        "pattern_matcher",
        (True, False),
        "Inductor's pattern-replacement passes (SDPA, GEMM fusions)",
    ),
    Switch(
        "gemm_backends",
        "max_autotune_gemm_backends",
        ("ATEN,TRITON", "ATEN", "TRITON"),
        "GEMM/conv implementations max-autotune chooses from",
        cuda_only=True,
        needs_autotune=True,
    ),
    Switch(
        "coordinate_descent_tuning",
        "coordinate_descent_tuning",
        (False, True),
        "coordinate-descent tuning of Triton launch configs",
        cuda_only=True,
    ),
    Switch("freezing", "freezing", (False, True), "fold weights into constants and pre-pack them (inference only)"),
    Switch(
        "layout_optimization",
        "layout_optimization",
        (True, False),
        "let Inductor pick channels-last layouts for convolutions",
        cuda_only=True,
    ),
)


def config_defaults() -> dict[str, Any]:
    """The installed torch's Inductor configuration (name -> current value)."""
    import torch._inductor.config as inductor_config

    return inductor_config.get_config_copy()


def mode_options(mode: str) -> dict[str, Any]:
    """The Inductor configuration a torch.compile mode sets."""
    import torch._inductor

    return dict(torch._inductor.list_mode_options(mode))


def config_problem(extra: Any) -> str | None:
    """What is wrong with a table of extra `torch._inductor.config` switches (None: nothing); checking needs torch."""
    require("torch", "backend.options.inductor_config", INSTALL)
    try:
        check_config(dict(extra))
    except UnknownSwitch as exc:
        return str(exc)
    return None


DEVICE = Option(
    "device",
    str,
    "auto",
    "where routes compile and run ('auto': CUDA when torch sees a GPU)",
    choices=("auto", "cuda", "cpu"),
)
MODULE = Option(
    "module",
    str,
    "",
    '"pkg.mod:fn" returning (torch.nn.Module, example inputs), used instead of converting the ONNX model',
    check=lambda v: (
        None if not v or (v.count(":") == 1 and all(v.split(":"))) else f'expected "package.module:function", got {v!r}'
    ),
)
INDUCTOR_CONFIG = Option(
    "inductor_config", dict, {}, "extra torch._inductor.config switches applied to every route", check=config_problem
)
OPTIONS = (DEVICE, MODULE, INDUCTOR_CONFIG)


def resolve_device(options: Mapping[str, Any]) -> str:
    """'cuda' or 'cpu' from backend.options.device ('auto' picks CUDA when torch sees a GPU)."""
    import torch

    wanted = str(DEVICE.get(options))
    if wanted not in ("auto", "cuda", "cpu"):
        raise TunerError(f"backend.options.device = {wanted!r}; expected 'auto', 'cuda' or 'cpu'")
    if wanted == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return wanted


def inductor_space(model: ModelInfo) -> SearchSpace:
    """The space for `model` on the device backend.options.device selects."""
    cuda = resolve_device(model.options) == "cuda"
    defaults = config_defaults()
    modes = MODES_CUDA if cuda else MODES_CPU
    set_by_mode = {m: set(mode_options(m)) for m in modes}
    precisions = PRECISIONS_CUDA if cuda else PRECISIONS_CPU
    params: list[Param] = [
        Param("mode", modes, "default", "torch.compile mode (reduce-overhead and max-autotune use CUDA graphs)"),
        Param(
            "precision", precisions, "fp32", "fp32 (no TF32), tf32 matmul/conv, or weights and inputs cast to bf16/fp16"
        ),
    ]
    if any(len(shape) == 4 for shape in model.input_shapes.values()):
        params.append(
            Param("channels_last", (False, True), False, "module and 4-D inputs in channels-last memory format")
        )
    for s in SWITCHES:
        if s.key not in defaults or (s.cuda_only and not cuda):
            continue
        default = defaults[s.key]
        choices = tuple(dict.fromkeys((default, *s.alternatives)))
        params.append(
            Param(s.name, choices, default, f"torch._inductor.config.{s.key}: {s.help}", when=_active(s, set_by_mode))
        )
    return SearchSpace(tuple(params))


def _active(s: Switch, set_by_mode: dict[str, set[str]]) -> Any:
    def when(route: Mapping[str, Value]) -> bool:
        mode = str(route["mode"])
        if s.key in set_by_mode.get(mode, set()):
            return False
        return not s.needs_autotune or "max_autotune" in set_by_mode.get(mode, set())

    return when


def compile_options(route: Mapping[str, Value], options: Mapping[str, Any]) -> dict[str, Any]:
    """The Inductor configuration for `route`: the mode's, the route's switches, then backend.options.inductor_config.

    Raises UnknownSwitch for a name the installed torch lacks or a value of the wrong type.
    """
    by_name = {s.name: s.key for s in SWITCHES}
    wanted: dict[str, Any] = {}
    for name, value in route.items():
        if name in by_name:
            wanted[by_name[name]] = value
    extra = INDUCTOR_CONFIG.get(options)
    if not isinstance(extra, Mapping):
        raise UnknownSwitch("backend.options.inductor_config must be a table of torch._inductor.config names")
    wanted.update(extra)
    check_config(wanted)
    return {**mode_options(str(route["mode"])), **wanted}


def check_config(wanted: Mapping[str, Any]) -> None:
    """Raise UnknownSwitch for a `torch._inductor.config` name the installed torch lacks or a value of the wrong
    type."""
    defaults = config_defaults()
    for key, value in wanted.items():
        if key not in defaults:
            raise UnknownSwitch(f"torch._inductor.config has no switch {key!r} in this torch version")
        current = defaults[key]
        if (
            current is not None
            and not isinstance(value, type(current))
            and not (isinstance(current, float) and isinstance(value, int))
        ):
            raise UnknownSwitch(f"torch._inductor.config.{key} takes {type(current).__name__}, got {value!r}")
