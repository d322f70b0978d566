"""Shared CLI pieces: loading a study file with its storage, printing, options."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tuner.spec import load_spec, resolve_storage
from tuner.study.setup import Context

console = Console()
err_console = Console(stderr=True)

SpecArg = Annotated[Path, typer.Argument(help="The study file (TOML).", show_default=False)]
StorageOpt = Annotated[str | None, typer.Option("--storage", help="Storage URL (overrides $TUNER_STORAGE and the study file).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def context(spec_path: Path, storage: str | None) -> Context:
    """Validate the study file, then bind it to its storage URL."""
    spec = load_spec(spec_path)
    return Context(spec, resolve_storage(spec, storage))


def fmt_ms(value: float | None) -> str:
    """Milliseconds for humans."""
    return "-" if value is None else f"{value:.3f} ms"


def fmt_x(value: float | None) -> str:
    """A speedup factor for humans."""
    return "-" if value is None else f"{value:.2f}x"
