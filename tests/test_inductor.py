"""The Inductor backend on the CPU (torch's C++ Inductor): space, switch validation, build, artifact, load, study.

Real torch, real onnx2torch, real compiles, real trial children and a real PostgreSQL study; the GPU
parts (CUDA events, CUDA graphs) run on the GPU machine (bench/gpu/run_study.sh). Skipped where
torch is not installed. Every compile here shares torch's default Inductor cache, as any torch
program on the machine does, so only the first run on a machine pays for Inductor's one-off C++
toolchain probes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest

from tests.conftest import REPO, SpecWriter, tuner
from tests.helpers import trial_dir
from tests.models import MLP_SHAPE as SHAPE
from tests.models import mlp_onnx, mlp_weights
from tuner import job as J
from tuner.backends import get_backend
from tuner.backends.base import Artifact, BuildContext, BuildError, ModelInfo
from tuner.measure.gpu_timing import GpuTimingError
from tuner.measure.inputs import save_feeds
from tuner.measure.reference import compute_reference
from tuner.objective import ObjectiveSpec
from tuner.store.urls import normalize_url
from tuner.worker.isolate import run_isolated

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="PyTorch is not installed (pip install 'route-tuner[inductor]')")
BATCHES = (1, 2)  # the served batch sizes of the two-shape tests (SHAPE's batch among them)
FIXED = {  # a space of one route: every switch of the CPU space at one value
    "mode": ["default"],
    "precision": ["fp32"],
    "epilogue_fusion": [True],
    "aggressive_fusion": [False],
    "max_fusion_size": [64],
    "pattern_matcher": [True],
    "freezing": [False],
}


def mlp_module() -> tuple[Any, tuple[Any, ...]]:
    """The same MLP as a torch module (the `backend.options.module` entry point of these tests)."""
    import torch

    w1, b1, w2 = mlp_weights()
    first, second = torch.nn.Linear(18, 32), torch.nn.Linear(32, 4, bias=False)
    with torch.no_grad():
        first.weight.copy_(torch.from_numpy(w1.T))
        first.bias.copy_(torch.from_numpy(b1))
        second.weight.copy_(torch.from_numpy(w2.T))
    return torch.nn.Sequential(torch.nn.ConstantPad1d(1, 0.0), first, torch.nn.ReLU(), second), (torch.zeros(SHAPE),)


def wrong_shape_module() -> tuple[Any, tuple[Any, ...]]:
    """The MLP with example inputs of the wrong batch size."""
    import torch

    return mlp_module()[0], (torch.zeros(3, 16),)


@pytest.fixture(scope="module")
def shared_cache() -> Iterator[str]:
    """Torch's default Inductor cache for this machine, for the backend and every trial child."""
    if not HAS_TORCH:
        pytest.skip("PyTorch is not installed")
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
        yield default_cache_dir()


@pytest.fixture
def mlp(tmp_path: Path) -> tuple[Path, list[dict[str, np.ndarray]]]:
    """The MLP's ONNX file and two seeded feeds."""
    rng = np.random.default_rng(1)
    return mlp_onnx(tmp_path / "mlp.onnx"), [{"x": rng.uniform(-1, 1, SHAPE).astype(np.float32)} for _ in range(2)]


def _ctx(
    tmp_path: Path, model: Path, feeds: list[dict[str, np.ndarray]], options: dict[str, Any], out: str = "out"
) -> BuildContext:
    return BuildContext(ModelInfo(model, {"x": SHAPE}, options), tmp_path / "work", tmp_path / out, feeds)


def test_imports_and_registers_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import tuner.backends.inductor, tuner.measure.gpu_timing\n"
        "from tuner.backends import get_backend\n"
        "print(get_backend('inductor').name)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "inductor"


def test_cuda_event_timer_refuses_cleanly_without_a_gpu() -> None:
    if HAS_TORCH:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is present: the timer is exercised by bench/gpu/run_study.sh")
    from tuner.measure.gpu_timing import CudaEventTimer

    with pytest.raises(GpuTimingError):
        CudaEventTimer()


@needs_torch
def test_space_offers_the_installed_switches_with_torch_defaults(tiny_model: Path, mlp: tuple[Path, Any]) -> None:
    import torch._inductor.config as inductor_config

    from tuner.backends.inductor.space import SWITCHES

    backend = get_backend("inductor")
    defaults = inductor_config.get_config_copy()
    cpu = backend.space(ModelInfo(mlp[0], {"x": SHAPE}, {"device": "cpu"}))
    assert cpu.param("mode").choices == ("default", "max-autotune-no-cudagraphs")
    assert "channels_last" not in cpu.names() and "coordinate_descent_tuning" not in cpu.names()
    for s in SWITCHES:
        if s.name in cpu.names():
            assert cpu.param(s.name).default == defaults[s.key]
    cuda = backend.space(ModelInfo(tiny_model, {"x": (1, 3, 16, 16)}, {"device": "cuda"}))
    assert "channels_last" in cuda.names() and "reduce-overhead" in cuda.param("mode").choices
    coord, gemm = cuda.param("coordinate_descent_tuning"), cuda.param("gemm_backends")
    assert coord.active({"mode": "default"}) and not coord.active({"mode": "max-autotune"})  # the mode sets it
    assert gemm.active({"mode": "max-autotune"}) and not gemm.active({"mode": "reduce-overhead"})


@needs_torch
def test_switches_are_validated_against_torch() -> None:
    from tuner.backends.inductor.space import UnknownSwitch, compile_options

    assert compile_options({"mode": "max-autotune", "freezing": True}, {})["max_autotune"] is True
    with pytest.raises(UnknownSwitch, match="no switch 'no_such_switch'"):
        compile_options({"mode": "default"}, {"inductor_config": {"no_such_switch": True}})
    with pytest.raises(UnknownSwitch, match="takes bool"):
        compile_options({"mode": "default", "freezing": "yes"}, {})
    assert UnknownSwitch("x").failure_class == "unknown-switch"


@needs_torch
def test_unknown_switch_fails_the_trial_with_its_class(tmp_path: Path, mlp: tuple[Path, Any]) -> None:
    model, feeds = mlp
    feeds_path, ref_path = tmp_path / "feeds.npz", tmp_path / "ref.npz"
    save_feeds(feeds_path, feeds)
    save_feeds(ref_path, compute_reference(model, feeds))
    job = J.Job(
        backend="inductor",
        route={"mode": "default", "precision": "fp32"},
        model_path=str(model),
        input_shapes={"x": list(SHAPE)},
        options={"device": "cpu", "inductor_config": {"no_such_switch": True}},
        work_dir=str(tmp_path / "work"),
        out_dir=str(tmp_path / "out"),
        feeds_path=str(feeds_path),
        reference_path=str(ref_path),
        metric="max_abs",
        tolerance=1e-3,
        atol=1e-3,
        rtol=1e-3,
        gate_samples=1,
        timeout_s=120,
        objective=ObjectiveSpec(warmup_s=0.0, min_repeats=2, min_duration_s=0.0),
    )
    result = run_isolated(job, tmp_path / "trial")
    assert result.status == "unknown-switch"
    assert "no_such_switch" in result.message and result.phase == "build"


@needs_torch
def test_onnx_route_builds_runs_and_reloads_from_its_artifact(
    tmp_path: Path, mlp: tuple[Path, Any], shared_cache: str
) -> None:
    pytest.importorskip("onnx2torch", reason="onnx2torch (and the torchvision it imports) is not installed")
    from tuner.backends.inductor.engine import Engine

    model, feeds = mlp
    backend = get_backend("inductor")
    reference = compute_reference(model, feeds)
    route = backend.space(ModelInfo(model, {"x": SHAPE}, {"device": "cpu"})).default_route()
    ctx = _ctx(tmp_path, model, feeds, {"device": "cpu"})
    artifact = backend.build(route, ctx)
    with tarfile.open(artifact.path) as tar:
        assert tar.getnames() == ["manifest.json", "graph_000.py"]
        code = tar.extractfile("graph_000.py").read().decode()  # type: ignore[union-attr]
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
    assert "cpp_fused" in code and "def call(" in code  # Inductor's own output code, C++ kernel inline
    assert (
        manifest["route"] == route and manifest["graphs"] == 1 and manifest["device"] == "cpu"
    )  # one graph: no break at Pad or Reshape
    assert isinstance(artifact.handle, Engine)  # the in-process engine travels on the artifact to `load`
    with backend.load(artifact, route, ctx) as runner:
        assert runner.engine is artifact.handle  # not compiled a second time
        outputs = [runner.infer(f) for f in feeds]
        for got, want in zip(outputs, reference):
            np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)
        once = runner.timed(feeds[0])
        assert all(once() > 0 for _ in range(3))
        assert runner.timing_info()["clock"] == "host-perf_counter"
    assert runner.closed

    again = _ctx(tmp_path, model, feeds, {"device": "cpu"}, out="again")
    rebuilt = backend.build(route, again)
    assert rebuilt.info["cache_hits"] >= 1
    assert _sha(rebuilt.path) == _sha(artifact.path)  # same route, same code: same artifact bytes
    log: list[str] = []
    stored = Artifact(artifact.path, artifact.build_s, artifact.info)  # as read back in another process: no handle
    with backend.load(
        stored, route, BuildContext(again.model, again.work_dir, tmp_path / "load", feeds, log=log.append)
    ) as reloaded:
        assert reloaded.engine is not artifact.handle
        np.testing.assert_array_equal(reloaded.infer(feeds[0])["y"], outputs[0]["y"])
    assert log == []  # recompiled to the same code as the stored artifact


@needs_torch
def test_module_function_source_in_bf16(tmp_path: Path, mlp: tuple[Path, Any], shared_cache: str) -> None:
    model, feeds = mlp
    backend = get_backend("inductor")
    options = {"device": "cpu", "module": "tests.test_inductor:mlp_module"}
    route = {**backend.space(ModelInfo(model, {"x": SHAPE}, options)).default_route(), "precision": "bf16"}
    ctx = _ctx(tmp_path, model, feeds, options)
    runner = backend.load(backend.build(route, ctx), route, ctx)
    got, want = runner.infer(feeds[0])["y"], compute_reference(model, feeds[:1])[0]["y"]
    assert got.dtype == np.float32
    assert np.abs(got - want).max() < 0.05 and np.abs(got - want).max() > 0  # bf16: close, not bit-equal
    runner.close()
    bad = _ctx(tmp_path, model, feeds, {**options, "module": "tests.test_inductor:wrong_shape_module"}, out="bad")
    with pytest.raises(BuildError, match=r"example inputs have shapes \[\(3, 16\)\]"):
        backend.build(route, bad)


@needs_torch
@pytest.mark.slow
def test_inductor_study_end_to_end(
    tmp_path: Path, mlp: tuple[Path, Any], write_spec: SpecWriter, pg_url: str, shared_cache: str
) -> None:
    pytest.importorskip("onnx2torch", reason="onnx2torch (and the torchvision it imports) is not installed")
    spec = write_spec(
        **{
            "model.path": str(mlp[0]),
            "backend.name": "inductor",
            "backend.options": {"device": "cpu"},
            "backend.space": FIXED,
            "accuracy.metric": "max_abs",
            "accuracy.tolerance": 1e-4,
            "run.budget": 2,
        }
    )
    proc = tuner("run", str(spec), "--storage", pg_url, "--no-confirm", env={"TORCHINDUCTOR_CACHE_DIR": shared_cache})
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = optuna.load_study(study_name="tiny", storage=normalize_url(pg_url))
    trials = sorted(study.get_trials(), key=lambda t: t.number)
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
    first, second = trials
    assert first.user_attrs["failure_class"] == "" and first.value > 0
    assert second.user_attrs["cache_hit"] is True  # the one route of this space was not compiled twice
    artifacts = list((tmp_path / ".tuner" / "tiny" / "artifacts").glob("*.tar"))
    assert [a.name for a in artifacts] == [f"{first.user_attrs['artifact_sha256']}.tar"]
    first_dir = trial_dir(pg_url, "tiny", tmp_path / ".tuner" / "tiny", 0)
    result = json.loads((first_dir / "result.json").read_text())
    assert result["timing_info"]["clock"] == "host-perf_counter" and result["build_s"] > 0
    # a CPU route's child is forked from the study's server, which imported torch once
    assert json.loads((first_dir / "job.json").read_text())["preload"][:2] == ["tuner.backends.inductor", "torch"]
    assert "fresh interpreter" not in proc.stderr, proc.stderr[-3000:]


@needs_torch
def test_cpu_routes_are_forked_from_a_server_and_cuda_routes_get_a_fresh_process() -> None:
    backend = get_backend("inductor")
    assert backend.fork_safe({}, {"device": "cpu"}) is True
    assert backend.fork_safe({}, {"device": "cuda"}) is False  # CUDA cannot be used in a forked child


def _served(model: Path, options: dict[str, Any]) -> ModelInfo:
    """The MLP served at every batch of BATCHES (its [model] shape SHAPE), as [[objective.shapes]] gives it."""
    return ModelInfo(model, {"x": SHAPE}, options, tuple(({"x": (n, SHAPE[1])}, 1.0) for n in BATCHES))


def _batch_feeds() -> dict[int, dict[str, np.ndarray]]:
    rng = np.random.default_rng(2)
    return {n: {"x": rng.uniform(-1, 1, (n, SHAPE[1])).astype(np.float32)} for n in BATCHES}


def test_the_code_hash_leaves_out_the_number_inductor_gives_a_graph_in_its_process(tmp_path: Path) -> None:
    from tuner.backends.inductor.build import code_digest, pack, stored_codes

    code = "# AOT ID: ['0_inference']\nfrom ctypes import c_void_p\n\ndef call(args):\n    return kernel_0(args)\n"
    later = code.replace("'0_inference'", "'3_inference'")  # the same graph, compiled after three others
    assert code_digest([code]) == code_digest([later])
    assert code_digest([code]) != code_digest([code.replace("kernel_0", "kernel_1")])
    assert code_digest([code, later]) != code_digest([code])
    # A reload compares with the artifact's own graph files, whatever hash its manifest holds
    pack([code, code.replace("kernel_0", "kernel_1")], {"code_sha256": "hashed-another-way"}, tmp_path / "a.tar")
    assert stored_codes(tmp_path / "a.tar") == [code, code.replace("kernel_0", "kernel_1")]


@needs_torch
def test_each_served_shape_gets_its_own_compiled_module_also_when_reloaded(tmp_path: Path, shared_cache: str) -> None:
    pytest.importorskip("onnx2torch", reason="onnx2torch (and the torchvision it imports) is not installed")
    model, feeds = mlp_onnx(tmp_path / "mlp.onnx", batch="batch"), _batch_feeds()
    backend = get_backend("inductor")
    info = _served(model, {"device": "cpu"})
    route = backend.space(info).default_route()
    artifact = backend.build(route, BuildContext(info, tmp_path / "work", tmp_path / "out", [feeds[2]]))
    with tarfile.open(artifact.path) as tar:
        assert tar.getnames() == ["manifest.json", "graph_000.py", "graph_001.py"]  # Reshape/Pad fixed per shape
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
    assert manifest["graphs"] == 2 and manifest["shapes"] == [
        {"inputs": {"x": [n, SHAPE[1]]}, "graphs": 1} for n in BATCHES
    ]
    assert [s["inputs"] for s in artifact.info["shapes"]] == [s["inputs"] for s in manifest["shapes"]]
    assert all(s["compile_s"] > 0 for s in artifact.info["shapes"])  # the build's timings cover every shape
    log: list[str] = []
    stored = Artifact(artifact.path, artifact.build_s, artifact.info)  # as read back in another process: no handle
    for loaded, out in ((artifact, "load"), (stored, "reload")):
        with backend.load(
            loaded, route, BuildContext(info, tmp_path / "work", tmp_path / out, [feeds[2]], log=log.append)
        ) as runner:
            for feed in feeds.values():
                want = compute_reference(model, [feed])[0]["y"]
                np.testing.assert_allclose(runner.infer(feed)["y"], want, rtol=1e-5, atol=1e-5)
            with pytest.raises(RuntimeError, match=r"no module was compiled for input shapes \[\(3, 16\)\]"):
                runner.infer({"x": np.zeros((3, SHAPE[1]), np.float32)})
    assert log == []  # recompiled to the same code at both shapes


@needs_torch
def test_a_module_function_serves_every_shape_and_its_examples_must_be_one_of_them(
    tmp_path: Path, shared_cache: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch._dynamo

    torch._dynamo.reset()  # the module's forward is one code object for every shape: its compiled frames count
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)  # against this; the engine raises it by two
    model, feeds = mlp_onnx(tmp_path / "mlp.onnx", batch="batch"), _batch_feeds()
    backend = get_backend("inductor")
    info = _served(model, {"device": "cpu", "module": "tests.test_inductor:mlp_module"})
    route = backend.space(info).default_route()
    ctx = BuildContext(info, tmp_path / "work", tmp_path / "out", [feeds[2]])
    artifact = backend.build(route, ctx)
    assert [s["graphs"] for s in artifact.info["shapes"]] == [1, 1]
    with backend.load(artifact, route, ctx) as runner:
        got = runner.infer(feeds[1])["y"]
    np.testing.assert_allclose(got, compute_reference(model, [feeds[1]])[0]["y"], rtol=1e-5, atol=1e-5)
    bad = _served(model, {"device": "cpu", "module": "tests.test_inductor:wrong_shape_module"})
    with pytest.raises(
        BuildError,
        match=r"example inputs have shapes \[\(3, 16\)\]; the study's inputs are "
        r"\[\(1, 16\)\] or \[\(2, 16\)\]$",
    ):
        backend.build(route, BuildContext(bad, tmp_path / "work", tmp_path / "bad", [feeds[2]]))


@needs_torch
@pytest.mark.slow
def test_a_two_shape_inductor_study_is_timed_at_each_shape_and_exports_both(
    cli, tmp_path: Path, write_spec: SpecWriter, pg_url: str, shared_cache: str
) -> None:
    pytest.importorskip("onnx2torch", reason="onnx2torch (and the torchvision it imports) is not installed")

    spec = write_spec(
        **{
            "model.path": str(mlp_onnx(tmp_path / "mlp.onnx", batch="batch")),
            "model.inputs": {"x": {"shape": list(SHAPE)}},
            "backend.name": "inductor",
            "backend.options": {"device": "cpu"},
            "backend.space": {**FIXED, "max_fusion_size": [64, 16]},  # two routes: the default and one candidate
            "accuracy.metric": "max_abs",
            "accuracy.tolerance": 1e-4,
            "objective.shapes": [{"inputs": {"x": [n, SHAPE[1]]}, "weight": 1.0} for n in BATCHES],
            "run.budget": 2,
            "run.racing": False,
        }
    )
    env = {"TORCHINDUCTOR_CACHE_DIR": shared_cache}
    proc = cli("run", str(spec), "--storage", pg_url, "--no-confirm", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = optuna.load_study(study_name="tiny", storage=normalize_url(pg_url))
    trials = sorted(study.get_trials(), key=lambda t: t.number)
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
    candidate = trials[1].user_attrs
    assert candidate["failure_class"] == "" and candidate["cache_hit"] is False
    assert [s["inputs"]["x"][0] for s in candidate["build_info"]["shapes"]] == list(BATCHES)
    measured = candidate["shapes"]  # timed at each shape, paired with the default route compiled for each
    assert [s["inputs"]["x"][0] for s in measured] == list(BATCHES)
    assert all(s["route_ms"] > 0 and s["default_ms"] > 0 and s["speedup"] > 0 and s["ci"] for s in measured)

    out = tmp_path / "export"
    best = cli("best", str(spec), "--storage", pg_url, "--export", str(out), "--trial", "1")
    assert best.returncode == 0, best.stderr[-3000:]
    snippet = (out / "compile_inductor.py").read_text()
    assert "SHAPES = [{'x': [1, 16]}, {'x': [2, 16]}]" in snippet
    ran = _run_snippet(out, tmp_path, env)
    assert ran.stdout.strip().splitlines()[-2:] == ["[[1, 4]]", "[[2, 4]]"]  # compiled and run at each shape


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_export_snippet_compiles_the_route_as_the_trial_did(
    tmp_path: Path, mlp: tuple[Path, Any], shared_cache: str
) -> None:
    pytest.importorskip("onnx2torch", reason="onnx2torch (and the torchvision it imports) is not installed")

    from tuner.backends.base import ExportRequest

    model, feeds = mlp
    backend = get_backend("inductor")
    route = {**backend.space(ModelInfo(model, {"x": SHAPE}, {"device": "cpu"})).default_route(), "freezing": True}
    artifact = backend.build(route, _ctx(tmp_path, model, feeds, {"device": "cpu"}))
    recorded = json.loads(json.dumps(dict(artifact.info), default=str))  # as the trial's build_info keeps it
    request = ExportRequest(
        route=route,
        artifact=artifact.path,
        build_info=recorded,
        model=ModelInfo(model, {"x": SHAPE}, {"device": "cpu"}),
        work_dir=tmp_path / "work",
        backend_version=backend.version(),
        inputs={"x": {"shape": list(SHAPE), "dtype": "float32", "batch_axis": 0}},
        shapes=[],
    )
    d = backend.deployment(request)
    assert (
        d.artifact_name == "inductor.tar"
        and d.files["model.onnx"] == model
        and d.commands == ["python3 compile_inductor.py"]
    )
    snippet = str(d.files["compile_inductor.py"])
    assert (
        "torch.compile(module, dynamic=False, options=OPTIONS)" in snippet and "'freezing': True" in snippet
    )  # the recorded configuration
    assert "SHAPES = [{'x': [2, 16]}]" in snippet  # without [[objective.shapes]]: the [model] shapes
    out = tmp_path / "export"
    out.mkdir()
    (out / "compile_inductor.py").write_text(snippet)
    (out / "model.onnx").write_bytes(model.read_bytes())
    ran = _run_snippet(out, tmp_path, {"TORCHINDUCTOR_CACHE_DIR": shared_cache})
    assert ran.stdout.strip().splitlines()[-1] == "[[2, 4]]"


def _run_snippet(export: Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the export's compile_inductor.py in a fresh interpreter (with `env` added); it must succeed."""
    ran = subprocess.run(
        [sys.executable, str(export / "compile_inductor.py")],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    return ran
