"""Which TensorRT is importable here, and what its version offers.

Two module families share one Python API: enterprise TensorRT (`tensorrt`, 10.x/11.x) and
TensorRT-RTX (`tensorrt_rtx`, 1.x). Nothing is imported at module load: a machine without TensorRT
can still import the backend, list it and print why it cannot run.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from types import ModuleType

from tuner.errors import MissingLibrary, first_line

# Import names tried in order: the PyPI `tensorrt` package, its bare bindings, then TensorRT-RTX.
# TensorRT is not among route-tuner's extras ("tensorrt" brings cuda-python only): NVIDIA ships it.
WHERE_FROM = (
    "TensorRT comes from NVIDIA: its `tensorrt` wheel (pip install tensorrt, from NVIDIA's package index) "
    "or NVIDIA's TensorRT container (the Dockerfile here builds on it); then pip install 'route-tuner[tensorrt]'"
)
MODULES = (
    ("tensorrt", "tensorrt"),
    ("tensorrt_bindings", "tensorrt"),
    ("tensorrt_rtx", "tensorrt_rtx"),
    ("tensorrt_rtx_bindings", "tensorrt_rtx"),
)


@dataclass(frozen=True)
class Features:
    """What a TensorRT flavour and version offer to the search space (tensorrt.md §7.4)."""

    flavor: str  # "tensorrt" or "tensorrt_rtx"
    version: str

    @property
    def release(self) -> tuple[int, int]:
        """(major, minor) of the version string."""
        major, minor, *_ = self.version.split(".") + ["0", "0"]
        return int(major), int(minor)

    @property
    def rtx(self) -> bool:
        """TensorRT-RTX (1.x): strongly typed, the 11.x builder knobs, no GPT knobs."""
        return self.flavor == "tensorrt_rtx"

    @property
    def weak_typing(self) -> bool:
        """10.x: precision builder flags (FP16/BF16/INT8/FP8) and weakly typed networks exist."""
        return not self.rtx and self.release < (11, 0)

    @property
    def legacy_tactics(self) -> bool:
        """10.x: the CUBLAS/CUBLAS_LT/CUDNN tactic sources exist."""
        return self.weak_typing

    @property
    def max_num_tactics(self) -> bool:
        """`IBuilderConfig.max_num_tactics` exists (10.4+, 11.x, RTX)."""
        return self.rtx or self.release >= (10, 4)

    @property
    def tiling(self) -> bool:
        """`tiling_optimization_level` and `l2_limit_for_tiling` exist (10.8+, 11.x, RTX)."""
        return self.rtx or self.release >= (10, 8)

    @property
    def gpt_api(self) -> bool:
        """`build_route`/`all_build_routes` can carry knobs (enterprise 11.1+; empty on RTX)."""
        return not self.rtx and self.release >= (11, 1)


@dataclass(frozen=True)
class TrtApi:
    """The imported TensorRT module with its features."""

    trt: ModuleType
    features: Features

    @property
    def label(self) -> str:
        """E.g. 'tensorrt 11.4.0.106' or 'tensorrt_rtx 1.7.1.116'."""
        return f"{self.features.flavor} {self.features.version}"


@cache
def load_trt() -> TrtApi:
    """Import the first available TensorRT module (MissingLibrary with one clear line if there is none)."""
    reasons = []
    for name, flavor in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:  # also OSError-derived load failures surface as ImportError
            reasons.append(f"{name}: {first_line(exc, type(exc).__name__)}")
            continue
        return TrtApi(module, Features(flavor, str(module.__version__)))
    raise MissingLibrary(
        f"no TensorRT module is importable (tried {', '.join(n for n, _ in MODULES)}); {reasons[0]}. {WHERE_FROM}"
    )
