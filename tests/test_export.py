"""`tuner best --export`: a directory a deployment engineer runs as is, written all at once and never through a link.

Real studies on real ONNX Runtime; the exported script runs in a fresh interpreter in isolated mode
(`-I`: no PYTHONPATH, no user site), so it uses onnxruntime and numpy and nothing of the tuner.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest

from tests.conftest import REPO, run_study
from tests.helpers import trials
from tuner.backends.onnxruntime.session import session_settings
from tuner.store.urls import normalize_url

NATIVE = {"engine.onnx", "session.json", "run_onnxruntime.py", "reproduce.sh", "route.json", "best.json", "README.md"}


def _isolated(script: Path, *args: str) -> dict:
    """Run an exported script with the venv's interpreter in isolated mode, from another directory; its JSON line."""
    run = subprocess.run(
        [sys.executable, "-I", str(script), *args],
        capture_output=True,
        text=True,
        cwd="/",
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture
def study_with_two_routes(write_spec, sqlite_url):
    """A finished study of the tiny model: the default route and the same route on one intra-op thread."""
    spec = write_spec(
        **{
            "run.budget": 2,
            "run.racing": False,
            "backend.space": {"precision": ["fp32"], "intra_op_threads": [0, 1], "execution_mode": ["sequential"]},
        }
    )
    run_study(spec, sqlite_url, 1)
    study = optuna.load_study(study_name="tiny", storage=normalize_url(sqlite_url))
    study.enqueue_trial({**study.trials[0].params, "intra_op_threads": 1, "graph_optimization_level": "basic"})
    run_study(spec, sqlite_url)
    return spec, sqlite_url


def test_the_onnxruntime_export_runs_alone_in_the_session_it_was_timed_with(
    cli, study_with_two_routes, tmp_path: Path
) -> None:
    spec, url = study_with_two_routes
    chosen = next(t for t in trials(url, "tiny") if t.params["intra_op_threads"] == 1)
    out = tmp_path / "export"
    result = cli("best", str(spec), "--storage", url, "--export", str(out), "--trial", str(chosen.number))
    assert result.returncode == 0, result.stderr
    assert {p.name for p in out.iterdir()} == NATIVE and not list(tmp_path.glob(".export.*"))  # no staging left behind

    session = json.loads((out / "session.json").read_text())
    assert session["session_options"] == session_settings(chosen.params)["session_options"]  # what the timing used
    options = session["session_options"]
    assert (
        options["intra_op_num_threads"] == 1 and options["graph_optimization_level"] == "ORT_DISABLE_ALL"
    )  # optimised offline
    assert session["config_entries"] == {"session.force_spinning_stop": "1"} and session["providers"] == [
        "CPUExecutionProvider"
    ]
    import onnxruntime as ort

    assert all(hasattr(ort.SessionOptions(), name) for name in options)  # ONNX Runtime's own names

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "inputs.npz", x=rng.uniform(-1, 1, (3, 3, 16, 16)).astype(np.float32))  # 3 samples along axis 0
    ran = _isolated(out / "run_onnxruntime.py", "--data", str(tmp_path / "inputs.npz"), "--runs", "20")
    assert ran["outputs"] == {"y": [1, 10]} and ran["samples"] == 3 and ran["runs"] == 20 and ran["median_ms"] > 0
    assert _isolated(out / "run_onnxruntime.py", "--runs", "5")["outputs"] == {
        "y": [1, 10]
    }  # random inputs of the measured shape

    readme = (out / "README.md").read_text()
    assert "intra-op threads (0: ORT decides) (intra_op_threads): 0 -> 1" in readme
    assert "ORT graph optimisation level (graph_optimization_level): all -> basic" in readme
    assert "execution_mode" not in readme.split("## What was measured")[0]  # unchanged knobs are not listed
    assert (
        "`x` [1, 3, 16, 16]" in readme and "cosine = " in readme and "peak memory" in readme and "machine: " in readme
    )
    script = (out / "reproduce.sh").read_text()
    assert 'cd "$(dirname "$0")"' in script and "pip install onnxruntime==" in script and str(tmp_path) not in script
    best = cli("best", str(spec), "--storage", url)  # plain: the verdict's route by what it changes, in words
    assert (
        best.returncode == 0 and "provider=cpu" not in best.stdout and "changes from the default route:" in best.stdout
    )
    assert ("nothing: this is the default route" in best.stdout) != ("(intra_op_threads): 0 -> 1" in best.stdout)


def test_the_export_never_writes_through_a_symbolic_link_and_leaves_nothing_half_written(
    cli, study_with_two_routes, tmp_path: Path
) -> None:
    spec, url = study_with_two_routes
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "victim.txt"
    victim.write_text("mine")

    linked = tmp_path / "linked"
    linked.symlink_to(elsewhere, target_is_directory=True)
    refused = cli("best", str(spec), "--storage", url, "--export", str(linked), "--trial", "0")
    assert refused.returncode == 2 and "symbolic link" in refused.stderr
    assert sorted(p.name for p in elsewhere.iterdir()) == ["victim.txt"]

    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("the user's")
    (out / "session.json").symlink_to(victim)
    refused = cli("best", str(spec), "--storage", url, "--export", str(out), "--trial", "0")
    assert refused.returncode == 2 and "session.json is a symbolic link" in refused.stderr
    assert victim.read_text() == "mine" and sorted(p.name for p in out.iterdir()) == [
        "notes.txt",
        "session.json",
    ]  # nothing moved
    assert not list(tmp_path.glob(".out.*"))

    (out / "session.json").unlink()
    assert cli("best", str(spec), "--storage", url, "--export", str(out), "--trial", "0").returncode == 0
    assert {p.name for p in out.iterdir()} == NATIVE | {"notes.txt"} and (out / "notes.txt").read_text() == "the user's"


def test_the_bundled_models_exported_int8_route_runs_with_only_onnxruntime_and_numpy(
    cli, tmp_path: Path, sqlite_url: str
) -> None:
    """The bundled EfficientNet-Lite0: its default route and ONNX Runtime's recommended int8 recipe, the latter
    exported."""
    models = REPO / "models"
    spec = tmp_path / "effnet.toml"
    spec.write_text(f"""[study]
name = "effnet"
[model]
path = "{models / "efficientnet_lite0.onnx"}"
inputs.images = {{ shape = [1, 3, 224, 224] }}
[data]
file = "{models / "efficientnet_lite0_val.npz"}"
samples = 4
gate_samples = 2
[accuracy]
metric = "top1_mismatch"
tolerance = 0.25
[objective]
warmup_s = 0.0
min_repeats = 5
min_duration_s = 0.05
timing_cap_s = 1.0
target_halfwidth = 0.2
block_s = 0.002
contention = "shared"
[backend]
name = "onnxruntime"
[run]
budget = 2
racing = false
trial_timeout_s = 600
""")
    run_study(spec, sqlite_url)
    int8 = next(t for t in trials(sqlite_url, "effnet") if t.params["precision"] == "int8_static")
    assert int8.user_attrs.get("feasible"), int8.user_attrs
    out = tmp_path / "winner"
    assert (
        cli("best", str(spec), "--storage", sqlite_url, "--export", str(out), "--trial", str(int8.number)).returncode
        == 0
    )
    ran = _isolated(out / "run_onnxruntime.py", "--data", str(models / "efficientnet_lite0_val.npz"), "--runs", "16")
    assert ran["samples"] == 16 and list(ran["outputs"].values()) == [[1, 1000]]
    readme = (out / "README.md").read_text()
    assert "precision variant of the ONNX graph (precision): fp32 -> int8_static" in readme


def test_changes_are_the_knobs_that_differ_from_the_default_route_in_the_spaces_words() -> None:
    from tuner.export.describe import change_lines
    from tuner.space import Param, SearchSpace

    space = SearchSpace(
        (
            Param("precision", ("fp32", "fp16"), "fp32", "precision variant"),
            Param("keep", ("a", "b"), "a", "ops kept in fp32", when=lambda r: r["precision"] == "fp16"),
            Param("threads", (0, 1), 0, "intra-op threads"),
        )
    )
    default = space.default_route()
    assert change_lines(default, default, space) == ["nothing: this is the default route"]
    assert change_lines(space.complete({"precision": "fp16", "threads": 1}), default, space) == [
        "precision variant (precision): fp32 -> fp16",
        "ops kept in fp32 (keep): not used by the default route -> a (the knob's default)",
        "intra-op threads (threads): 0 -> 1",
    ]
    assert change_lines({**default, "threads": 1}, default) == [
        "threads: 0 -> 1"
    ]  # no space here (e.g. no TensorRT): names only
