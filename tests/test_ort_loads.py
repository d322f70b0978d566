"""What is built loads: an ONNX Runtime variant whose offline-optimised file does not load is shipped optimised at load.

ONNX Runtime writes the fp16 variant of a model with an `If` node (the Silero-VAD-shaped test model)
as an optimised file that its own checker then refuses ("Graph must be in single static assignment
form"); the route must still run, with the artifact saying how it was optimised. Real ONNX Runtime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import BRIEF_TIMING, run_study
from tests.helpers import trials
from tests.models import conv_model, vad_model
from tests.test_inputs import CONSTANTS, MODEL
from tuner import job as J
from tuner.backends.base import BuildContext, ModelInfo
from tuner.backends.onnxruntime import OnnxRuntimeBackend
from tuner.backends.onnxruntime.session import LOAD_LEVEL_KEY
from tuner.measure.reference import compute_reference
from tuner.spec.toml import dumps

SHAPES = {"input": (1, 512), "state": (2, 1, 128), "sr": ()}
FEED = {
    "input": np.linspace(-0.5, 0.5, 512, dtype=np.float32)[None],
    "state": np.zeros((2, 1, 128), np.float32),
    "sr": np.array(16000, np.int64),
}


def _built(tmp_path: Path, model: Path, shapes: dict, feed: dict, **route: object) -> tuple[dict, dict, dict]:
    """(artifact info, load settings, outputs) of the route built and run by the real backend."""
    backend = OnnxRuntimeBackend()
    info = ModelInfo(model, shapes)
    chosen = backend.space(info).complete(route)
    ctx = BuildContext(
        info, tmp_path / "work", tmp_path / f"out-{len(list(tmp_path.iterdir()))}", [feed], log=lambda _: None
    )
    artifact = backend.build(chosen, ctx)
    with backend.load(artifact, chosen, ctx) as runner:
        return dict(artifact.info), runner.settings, runner.infer(feed)


@pytest.mark.parametrize("keep", ["sensitive", "norm_softmax", "none"])
def test_an_if_model_in_fp16_ships_the_variant_optimised_at_load(tmp_path: Path, keep: str) -> None:
    model = vad_model(tmp_path / "vad.onnx")
    info, settings, outputs = _built(tmp_path, model, SHAPES, FEED, precision="fp16", keep_fp32=keep)
    assert info["graph_optimization"] == "at-load" and "INVALID_GRAPH" in info["offline_file_refused"]
    assert (
        settings["session_options"]["graph_optimization_level"] == "ORT_ENABLE_ALL"
    )  # the route's level, applied at load
    reference = compute_reference(model, [FEED])[0]
    assert np.allclose(outputs["output"], reference["output"], atol=1e-2) and outputs["stateN"].shape == (2, 1, 128)


def test_a_file_that_loads_stays_optimised_offline(tmp_path: Path) -> None:
    import onnx

    model = conv_model(tmp_path / "cnn.onnx")
    info, settings, _ = _built(
        tmp_path, model, {"x": (1, 3, 16, 16)}, {"x": np.ones((1, 3, 16, 16), np.float32)}, precision="fp16"
    )
    assert info["graph_optimization"] == "offline" and "offline_file_refused" not in info
    assert settings["session_options"]["graph_optimization_level"] == "ORT_DISABLE_ALL"
    artifact = next((tmp_path).glob("out-*/engine.onnx"))
    assert LOAD_LEVEL_KEY not in {p.key for p in onnx.load(str(artifact)).metadata_props}


STUDY = f"""[study]
name = "vad-fp16"

{MODEL}
[data]
samples = 3
gate_samples = 1
{CONSTANTS}
[accuracy]
metric = "cosine"
tolerance = 0.01

{dumps({"objective": BRIEF_TIMING})}
[backend]
name = "onnxruntime"
space.precision = ["fp32", "fp16"]
space.graph_optimization_level = ["all"]
space.execution_mode = ["sequential"]
space.intra_op_threads = [0]
space.cpu_mem_arena = [true]
space.mem_pattern = [true]

[run]
budget = 4
heartbeat_s = 0.5
racing = false
"""


def test_the_vad_models_fp16_routes_run_in_a_study(tmp_path: Path, sqlite_url: str) -> None:
    vad_model(tmp_path / "vad.onnx")
    study = tmp_path / "vad.toml"
    study.write_text(STUDY)
    run_study(study, sqlite_url)
    done = [t for t in trials(sqlite_url, "vad-fp16") if t.state.is_finished()]
    fp16 = [t for t in done if t.params["precision"] == "fp16"]
    assert len(done) == 4 and {t.params["keep_fp32"] for t in fp16} == {
        "sensitive",
        "norm_softmax",
        "none",
    }  # every route once
    failed = [
        (t.params, t.user_attrs.get("failure_class"), t.user_attrs.get("message"))
        for t in done
        if J.OUTCOMES[t.user_attrs.get("failure_class") or J.OK].tally == "failed"
    ]
    assert failed == []
    assert all(t.user_attrs["build_info"]["graph_optimization"] == "at-load" for t in fp16)  # what was done is recorded
    baseline = next(t for t in done if t.params["precision"] == "fp32")
    assert baseline.user_attrs["build_info"]["graph_optimization"] == "offline"
    assert all(
        t.user_attrs["memory_kind"] == "host-rss"
        and t.user_attrs["peak_memory_mb"] > 0
        and t.user_attrs["artifact_bytes"] > 0
        for t in done
    )
