"""`tuner probe`, and the backend where TensorRT is missing or is a stand-in module.

TensorRT's native library cannot run here. The stand-in modules below (named stand-ins) provide only
`__version__` and, for 11.4, the few classes the probe child reads, so version detection, the GPT
knob-database probe (a real child process) and the space/study attributes built from it run for real.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import tuner
from tests.models import conv_model
from tests.test_tensorrt_mapping import KNOB_DB
from tuner.backends.base import ModelInfo
from tuner.backends.tensorrt import TensorRTBackend
from tuner.backends.tensorrt.probe import knob_database
from tuner.backends.tensorrt.version import MODULES, load_trt
from tuner.errors import MissingLibrary

STAND_IN_TRT_11 = '''"""Stand-in for the TensorRT 11.4 module (its native library cannot run here): \
what the probe reads."""
import enum

__version__ = "11.4.0.106"


class ILogger:
    class Severity(enum.IntEnum):
        INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

    def __init__(self):
        pass


class IBuilderConfig:
    all_build_routes = {knobs!r}


class Builder:
    def __init__(self, logger):
        pass

    def create_builder_config(self):
        return IBuilderConfig()
'''


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory put on sys.path and PYTHONPATH for stand-in TensorRT modules; caches cleared around."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    load_trt.cache_clear()
    knob_database.cache_clear()
    yield tmp_path
    for name in ("tensorrt", "tensorrt_rtx"):
        sys.modules.pop(name, None)  # the stand-ins must not outlive the test
    load_trt.cache_clear()
    knob_database.cache_clear()


TRT_ABSENT = not any(importlib.util.find_spec(name) for name, _ in MODULES)
needs_no_trt = pytest.mark.skipif(
    not TRT_ABSENT, reason="a TensorRT module is importable here (e.g. the project's GPU image)"
)


@needs_no_trt
def test_backend_without_tensorrt_raises_one_clear_line() -> None:
    load_trt.cache_clear()
    backend = TensorRTBackend()
    for call in (backend.version, backend.device, lambda: backend.space(ModelInfo(Path("m.onnx"), {}))):
        with pytest.raises(MissingLibrary, match=r"^no TensorRT module is importable \(tried tensorrt, "):
            call()


def test_probe_lists_backends_and_exits_0() -> None:
    done = tuner("probe")
    assert done.returncode == 0, done.stderr
    assert "onnxruntime: 1." in done.stdout
    if TRT_ABSENT:
        assert "tensorrt: unavailable: no TensorRT module is importable" in done.stdout
    else:
        assert any(line.startswith("tensorrt: ") for line in done.stdout.splitlines()), done.stdout


@needs_no_trt
def test_probe_of_a_backend_whose_library_is_missing_exits_3() -> None:
    done = tuner("probe", "--backend", "tensorrt")
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith("error: backend tensorrt cannot run here: no TensorRT module is importable")
    assert len(done.stderr.strip().splitlines()) == 1 and "TensorRT comes from NVIDIA" in done.stderr


def test_probe_json_for_an_available_backend() -> None:
    done = tuner("probe", "--backend", "onnxruntime", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["backends"]["onnxruntime"]["available"] is True


def test_rtx_is_detected_and_offers_no_gpt_knobs(stand_in: Path) -> None:
    (stand_in / "tensorrt_rtx.py").write_text(
        '"""Stand-in for TensorRT-RTX 1.7 (version only)."""\n__version__ = "1.7.1.116"\n'
    )
    backend = TensorRTBackend()
    assert backend.version() == "tensorrt_rtx 1.7.1.116"
    space = backend.space(ModelInfo(conv_model(stand_in / "m.onnx"), {}))
    assert not any(n.startswith("knob:") for n in space.names())
    assert "tiling_optimization_level" in space.names() and "builder_precision" not in space.names()


def test_knob_database_is_probed_in_a_child_and_recorded(stand_in: Path) -> None:
    (stand_in / "tensorrt.py").write_text(STAND_IN_TRT_11.format(knobs=json.dumps(KNOB_DB)))
    backend = TensorRTBackend()
    model = ModelInfo(conv_model(stand_in / "m.onnx"), {}, {"gpt_knobs": {"-cask_fusion:num_tactics": [10, 20]}})
    space = backend.space(model)
    knobs = [n for n in space.names() if n.startswith("knob:")]
    assert knobs == [
        "knob:-kgen:codegen:cuda_tile",
        "knob:-conv_lowering",
        "knob:-match_ragged_mha",
        "knob:-cask_fusion:num_tactics",
    ]
    attrs = backend.study_attrs(model)
    assert attrs["trt"] == "tensorrt 11.4.0.106" and attrs["gpt_tuner_version"] == "2.19.45" and attrs["gpt_knobs"] == 5
    assert attrs["gpt_default_build_route"].startswith("-kgen:codegen:cuda_tile=1 -conv_lowering=on")
