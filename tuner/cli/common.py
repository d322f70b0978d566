"""Shared CLI pieces: loading a study file with its storage, printing, options."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from tuner.api import Study
from tuner.store.urls import STORAGE_ENV, has_secret
from tuner.study.setup import Context
from tuner.study.verdict import confirmed_row

UNWRAPPED = 100_000  # the line width without a terminal: a log line is never split (a URL or a path stays whole)


def _console(stderr: bool = False) -> Console:
    """A rich console: on a terminal it wraps at the terminal's width; without one (a pipe, a log file) never."""
    out = Console(stderr=stderr)
    if not out.is_terminal:
        out.width, out.soft_wrap = UNWRAPPED, True
    return out


console = _console()
err_console = _console(stderr=True)


@dataclass
class Settings:
    """The options before the command (`tuner -q run ...`)."""

    quiet: bool = False  # -q: no progress, only the result and errors
    verbose: bool = False  # -v: each trial's whole route


settings = Settings()

SpecArg = Annotated[Path, typer.Argument(help="The study file (TOML).", show_default=False)]
StorageOpt = Annotated[
    str | None, typer.Option("--storage", help="Storage URL (overrides $TUNER_STORAGE and the study file).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help='Print JSON for scripts (errors too, as {"error": ...}).')]
NO_SPEEDUP_EXIT = 4  # --fail-if-no-speedup: the verdict is not a confirmed speedup
FailIfNoSpeedupOpt = Annotated[
    bool, typer.Option("--fail-if-no-speedup", help=f"Exit {NO_SPEEDUP_EXIT} unless the verdict is a speedup.")
]


def context(spec_path: Path, storage: str | None) -> Context:
    """Validate the study file, then bind it to its storage URL (warning if `--storage` carries a password)."""
    return study(spec_path, storage).context()


def study(spec_path: Path, storage: str | None) -> Study:
    """The study file as a `Study` bound to its storage (warning if `--storage` carries a password)."""
    return Study.from_file(spec_path, storage_option(storage))


def emit_json(doc: object) -> None:
    """One JSON document on stdout."""
    print(json.dumps(doc))


def storage_option(storage: str | None) -> str | None:
    """The `--storage` value, after warning (once) if it carries a password."""
    if storage is not None and has_secret(storage):
        warn_password_in_argv()
    return storage


@cache
def warn_password_in_argv() -> None:
    """Say once that a password on the command line is readable by every local user."""
    err_console.print(
        f"warning: --storage carries a password, and every local user can read a command line (ps); put the URL "
        f"in ${STORAGE_ENV} or the password in a pgpass file (~/.pgpass, $PGPASSFILE) instead",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def fmt_ms(value: float | None) -> str:
    """Milliseconds for humans."""
    return "-" if value is None else f"{value:.3f} ms"


def latency_line(doc: dict[str, Any]) -> str:
    """`  trial N: <ms>, default route <ms> ...` of a verdict document: both figures from one measurement, so that
    they agree with the speedup beside them (the confirmation's medians where it re-measured the trial, else the
    trial's own paired timing), leaving out what was not measured."""
    trial = doc["trial"]
    row = confirmed_row(doc, trial)
    if row is not None:
        return (
            f"  trial {trial}: {fmt_ms(row['median_ms'])}, default route {fmt_ms(row.get('default_median_ms'))} "
            f"(medians of the confirmation's {row['processes']} paired processes)"
        )
    pair = doc.get("measured_ms") or {}
    parts = []
    if pair.get("trial") is not None:
        parts.append(f"{fmt_ms(pair['trial'])} in the study")
    if pair.get("trial") is not None and pair.get("default") is not None:
        parts.append(f"default route {fmt_ms(pair['default'])} beside it")
    elif doc.get("default_ms") is not None:
        parts.append(f"default route {fmt_ms(doc['default_ms'])}")
    return f"  trial {trial}: " + (", ".join(parts) or "no latency measured in the study")


def fmt_x(value: float | None) -> str:
    """A speedup factor for humans."""
    return "-" if value is None else f"{value:.2f}x"
