"""Every bad input: one clear line on stderr naming the file/field, a non-zero exit, nothing written.

The study-file cases run the real CLI entry point in-process (validation fails before any database
is touched, which the storage URL of a database that does not exist proves); one case runs a real
`tuner` process against a real database and checks that nothing was written.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest

from tests.conftest import REPO, tuner
from tests.helpers import cli_in_process

SECRET = "s3cr3t-pw"


def _tables(pg_url: str) -> list[str]:
    conn = psycopg2.connect(pg_url)
    with conn.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        names = [r[0] for r in cur.fetchall()]
    conn.close()
    return names


def _fails_cleanly(result, *needles: str, code: int = 2) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err
    return err


CASES = {
    "missing model": ({"model.path": "nowhere.onnx"}, ("model.path", "not found")),
    "negative tolerance": ({"accuracy.tolerance": -0.1}, ("accuracy.tolerance", ">= 0")),
    "unknown metric": ({"accuracy.metric": "psnr"}, ("accuracy.metric", "max_abs")),
    "unknown backend": ({"backend.name": "tvm"}, ("backend.name", "unknown backend 'tvm'")),
    "unknown parameter": ({"backend.space": {"unroll": [1, 2]}}, ("backend.space.unroll", "unknown parameter")),
    "value not offered": ({"backend.space": {"precision": ["fp32", "int4"]}}, ("backend.space.precision", "int4")),
    "default dropped": ({"backend.space": {"precision": ["int8_static"]}}, ("backend.space.precision", "default")),
    "wrong shape": ({"model.inputs": {"x": {"shape": [1, 3, 8, 8]}}}, ("model.inputs.x.shape", "does not match")),
    "unknown input": ({"model.inputs": {"image": {"shape": [1, 3, 16, 16]}}}, ("model.inputs.image", "no such input")),
    "zero budget": ({"run.budget": 0}, ("run.budget", ">= 1")),
    "budget not an integer": ({"run.budget": "ten"}, ("run.budget", "integer")),
    "unknown field": ({"run.trials": 3}, ("run.trials", "unknown field")),
    "gate above samples": ({"data.gate_samples": 9}, ("data.gate_samples", "at most")),
    "unknown sampler": ({"run.sampler": "cmaes"}, ("run.sampler", "tpe")),
    "unknown timing mode": ({"objective.mode": "batch"}, ("objective.mode", "per-call, pipelined")),
    "target half-width of 100 %": ({"objective.target_halfwidth": 1.5}, ("objective.target_halfwidth", "below 1")),
    "zero timing cap": ({"objective.timing_cap_s": 0}, ("objective.timing_cap_s", "> 0")),
    "racing not a boolean": ({"run.racing": "yes"}, ("run.racing", "true or false")),
    "unknown backend option": (
        {"backend.options": {"bogus": 1}},
        ("backend.options.bogus", "unknown option", "model_type"),
    ),
    "bad backend option value": (
        {"backend.options": {"num_heads": "twelve"}},
        ("backend.options.num_heads", "integer"),
    ),
    "bad timing_cache": (
        {"backend.name": "tensorrt", "backend.options": {"timing_cache": "forever"}},
        ("backend.options.timing_cache", "'fresh', 'shared'"),
    ),
    "bad inductor_config": (
        {"backend.name": "inductor", "backend.options": {"device": "cpu", "inductor_config": {"no_such_switch": True}}},
        ("backend.options.inductor_config", "no switch 'no_such_switch'"),
    ),
    "bad inductor module": (
        {"backend.name": "inductor", "backend.options": {"module": "no_colon"}},
        ("backend.options.module", "package.module:function"),
    ),
}
UNTOUCHED = "postgresql://postgres@127.0.0.1:5432/tuner_never_created"  # validation must fail before any connection


HAS_TORCH = importlib.util.find_spec("torch") is not None
NEEDS_TORCH = {"bad inductor_config"}  # checked against the installed torch's Inductor configuration


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            c,
            marks=pytest.mark.skipif(
                c in NEEDS_TORCH and not HAS_TORCH,
                reason="needs PyTorch (pip install 'route-tuner[inductor]'); without it the case exits 3",
            ),
        )
        for c in sorted(CASES)
    ],
)
def test_bad_study_file_fields(case: str, write_spec, capsys, monkeypatch) -> None:
    overrides, needles = CASES[case]
    spec = write_spec(**overrides)
    _fails_cleanly(cli_in_process(capsys, monkeypatch, "run", str(spec), "--storage", UNTOUCHED), spec.name, *needles)


def test_paths_in_messages_are_normalised(write_spec, capsys, monkeypatch) -> None:
    spec = write_spec(**{"model.path": "../models/./../nowhere.onnx"})
    err = _fails_cleanly(cli_in_process(capsys, monkeypatch, "run", str(spec), "--storage", UNTOUCHED), "model.path")
    assert err.endswith(f"file not found: {spec.resolve().parent.parent / 'nowhere.onnx'}"), err
    assert "/../" not in err and "/./" not in err


BLOCKED = """import runpy, sys
for name in sys.argv.pop(1).split(","):
    sys.modules[name] = None  # the import system's own way of making a module unimportable
runpy.run_module("tuner", run_name="__main__")
"""


def _without(modules: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI in a process where `modules` (comma-separated) cannot be imported, as where they are not
    installed."""
    return subprocess.run(
        [sys.executable, "-c", BLOCKED, modules, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
    )


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"backend.name": "inductor", "backend.options": {"device": "cpu"}}, "the inductor backend needs torch"),
        (
            {"backend.name": "inductor", "backend.options": {"inductor_config": {"freezing": True}}},
            "backend.options.inductor_config needs torch",
        ),
        ({"run.sampler": "gp"}, "run.sampler: 'gp' needs torch"),
    ],
    ids=["inductor", "inductor_config", "gp sampler"],
)
def test_a_missing_optional_library_is_one_line_naming_the_extra_and_exits_3(
    overrides: dict, needle: str, write_spec
) -> None:
    spec = write_spec(**overrides)
    for command in (["run", str(spec), "--storage", UNTOUCHED], ["space", str(spec)]):
        done = _without("torch", *command)
        assert done.returncode == 3, (done.returncode, done.stderr)
        assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "Traceback" not in done.stderr
        assert done.stderr.startswith(f"error: {spec}: ") and needle in done.stderr, done.stderr
        assert "which is not installed: pip install 'route-tuner[" in done.stderr, done.stderr
    assert not (spec.parent / ".tuner").exists()


def test_a_bad_study_file_writes_nothing(write_spec, pg_url) -> None:
    """End to end (a real `tuner` process, a real database): refused before anything is written."""
    spec = write_spec(**{"backend.options": {"bogus": 1}})
    err = _fails_cleanly(tuner("run", str(spec), "--storage", pg_url), spec.name, "backend.options.bogus")
    assert (
        err
        == f"error: {spec}: backend.options.bogus: unknown option of the onnxruntime backend; it takes: model_type, "
        "num_heads, hidden_size"
    )
    assert _tables(pg_url) == []
    assert not (spec.parent / ".tuner").exists()


@pytest.mark.parametrize(
    "content", [b"", b"this is not a protobuf at all \xff\xfe", None], ids=["empty", "garbage", "truncated"]
)
def test_bad_model_files(content: bytes | None, write_spec, tiny_model: Path, capsys, monkeypatch) -> None:
    data = tiny_model.read_bytes()
    tiny_model.write_bytes(data[: len(data) // 2] if content is None else content)
    spec = write_spec()
    _fails_cleanly(
        cli_in_process(capsys, monkeypatch, "run", str(spec), "--storage", UNTOUCHED), "model.path", "tiny.onnx"
    )


def test_bad_toml(tmp_path: Path) -> None:
    spec = tmp_path / "broken.toml"
    spec.write_text("[study\nname = 'x'\n")
    _fails_cleanly(tuner("run", str(spec)), "broken.toml", "not valid TOML")


def test_missing_study_file(tmp_path: Path) -> None:
    _fails_cleanly(tuner("status", str(tmp_path / "absent.toml")), "absent.toml", "not found")


def test_bad_data_file(write_spec, tmp_path: Path) -> None:
    import numpy as np

    np.savez(tmp_path / "data.npz", x=np.zeros((2, 3, 8, 8), np.float32))
    spec = write_spec(**{"data.file": str(tmp_path / "data.npz")})
    _fails_cleanly(tuner("run", str(spec)), "data.file", "shape")


def test_unreachable_database_masks_the_password_and_exits_3(write_spec, tmp_path: Path) -> None:
    url = f"postgresql://tuner:{SECRET}@127.0.0.1:1/nothing"
    spec = write_spec()
    done = tuner("run", str(spec), "--storage", url)  # a password on the command line: warned about first
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "cannot connect" in last and "tuner:***@127.0.0.1:1" in last and SECRET not in done.stderr
    # the environment variable and the study file are masked the same way
    err = _fails_cleanly(tuner("status", str(spec), env={"TUNER_STORAGE": url}), "***", code=3)
    assert SECRET not in err
    assert not (tmp_path / ".tuner").exists() or not list((tmp_path / ".tuner").rglob("*.db"))


READ_ONLY = (("status",), ("status", "--json"), ("best",), ("best", "--json"), ("report", "--out", "report"))


@pytest.mark.parametrize("args", READ_ONLY, ids=" ".join)
def test_a_read_only_command_on_a_study_that_does_not_exist_writes_nothing(
    args, cli, write_spec, sqlite_url, pg_url, tmp_path
) -> None:
    spec = str(write_spec())
    _fails_cleanly(cli(*args[:1], spec, "--storage", sqlite_url, *args[1:]), "does not exist", "tuner run")
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()  # not even an empty file
    _fails_cleanly(cli(*args[:1], spec, "--storage", pg_url, *args[1:]), "does not exist", "tuner run")
    assert _tables(pg_url) == []
    assert not (tmp_path / "report").exists()


def test_the_dashboard_on_an_empty_storage_writes_nothing(cli, write_spec, sqlite_url, pg_url) -> None:
    spec = str(write_spec())
    _fails_cleanly(cli("dashboard", spec, "--storage", sqlite_url), "holds no study yet", "tuner run")
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()
    _fails_cleanly(cli("dashboard", spec, "--storage", pg_url), "holds no study yet", "tuner run")
    assert _tables(pg_url) == []
