"""API contract: every TensorRT name the backend uses exists in the real bindings.

The name lists in tools/trt_api/ were read from the real wheels (tensorrt-cu13-bindings 11.4.0.106,
tensorrt-rtx-cu13-bindings 1.7.1.116, tensorrt-cu12-bindings 10.16.1.11) by extract_names.py; the
bindings cannot be imported here. See docs/tensorrt-backend.md for how strict a qualified name is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_tensorrt_mapping import RecordingBuilderConfig, RecordingTimingCacheConfig, stand_in_trt

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "trt_api"))

from used_names import GPT_ONLY, TRT10_ONLY, missing, scan, used_names  # noqa: E402

LISTS = REPO / "tools" / "trt_api"
TRT11, RTX, TRT10 = (
    LISTS / "tensorrt-11.4.names.txt",
    LISTS / "tensorrt_rtx-1.7.names.txt",
    LISTS / "tensorrt-10.16.names.txt",
)


def test_the_scan_sees_every_kind_of_use() -> None:
    source = (
        "class M(trt.IProgressMonitor):\n    def step_complete(self, p, s): ...\n    def _own(self): ...\n"
        "def f(trt, config, engine):\n    config.set_flag(trt.BuilderFlag.TF32)\n"
        "    x = self.context.execute_async_v3(0)\n    trt.ILogger.__init__(x)\n    other.build_route = 1\n"
    )
    assert scan(source) == {
        "IProgressMonitor",
        "IProgressMonitor.step_complete",
        "IBuilderConfig.set_flag",
        "BuilderFlag.TF32",
        "IExecutionContext.execute_async_v3",
        "ILogger",
    }


def test_backend_uses_a_substantial_set_of_names() -> None:
    used = used_names()
    assert {
        "IBuilderConfig.build_route",
        "Builder.build_serialized_network",
        "OnnxParser.num_errors",
        "IExecutionContext.execute_async_v3",
        "Runtime.deserialize_cuda_engine",
        "TacticSource.EDGE_MASK_CONVOLUTIONS",
        "IProgressMonitor.step_complete",
    } <= used
    assert len(used) > 60


@pytest.mark.parametrize(
    ("names", "excluded"), [(TRT11, TRT10_ONLY), (RTX, TRT10_ONLY), (TRT10, GPT_ONLY)], ids=["11.4", "rtx-1.7", "10.16"]
)
def test_every_used_name_exists_in_the_bindings(names: Path, excluded: frozenset[str]) -> None:
    assert missing(used_names() - excluded, names) == []


def test_the_removed_10x_names_are_really_gone_in_11x() -> None:
    removed = sorted(n for n in TRT10_ONLY if n.startswith(("BuilderFlag.", "TacticSource.")))
    assert missing(set(removed), TRT11) == removed  # so the version gating in space.py/build.py is needed
    assert missing(set(removed), RTX) == removed
    assert missing(set(TRT10_ONLY), TRT10) == []


def test_the_check_is_strict_where_the_bindings_reveal_the_owner() -> None:
    wrong = {
        "IBuilderConfig.set_build_route",
        "ICudaEngine.build_route",
        "BuilderFlag.FP16",
        "IExecutionContext.execute_async_v2",
    }
    assert missing(wrong, TRT11) == sorted(wrong)


def test_the_stand_ins_only_use_real_names() -> None:
    config_members = {
        n for cls in (RecordingBuilderConfig, RecordingTimingCacheConfig) for n in vars(cls) if not n.startswith("_")
    }
    config_members -= {"props", "flags"}  # the stand-in's own helpers for the assertions
    assert missing({f"IBuilderConfig.{n}" for n in config_members | {"all_build_routes"}}, TRT11) == []
    trt = stand_in_trt()
    enums = {
        f"{owner}.{member}" for owner, e in vars(trt).items() if hasattr(e, "__members__") for member in e.__members__
    }
    assert missing(enums - TRT10_ONLY, TRT11) == []
    assert missing(enums, TRT10) == []


@pytest.mark.skipif(
    not os.environ.get("TRT_BINDINGS_WHEEL"),
    reason="set TRT_BINDINGS_WHEEL to a tensorrt-cu13-bindings 11.4.0.106 wheel",
)
def test_the_committed_list_matches_the_wheel(tmp_path: Path) -> None:
    out = tmp_path / "names.txt"
    subprocess.run(
        [sys.executable, str(LISTS / "extract_names.py"), os.environ["TRT_BINDINGS_WHEEL"], str(out)], check=True
    )
    assert out.read_text() == TRT11.read_text()
