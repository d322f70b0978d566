"""`tuner`: run, inspect and export route-tuning studies.

Exit statuses: 0 done; 2 bad input (study file, model, data, option); 3 environment or
infrastructure (database unreachable, workers died, a backend's library missing); 4 with
`--fail-if-no-speedup` when the verdict is not a speedup; 130 interrupted.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated

import typer
from sqlalchemy.exc import SQLAlchemyError

from tuner.cli import build, dashboard, db, gc, init, probe, report, results, run
from tuner.cli.common import err_console, settings
from tuner.errors import TunerError, first_line
from tuner.version import __version__

DATABASE_EXIT = 3  # the database failed: the environment, not the input
app = typer.Typer(
    help="Find the fastest engine for an ONNX model within an accuracy tolerance.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command("init")(init.init)
app.command("run")(run.run)
app.command("status")(results.status)
app.command("best")(results.best)
app.command("trials")(results.trials)
app.command("space")(results.space)
app.command("build")(build.build)
app.command("dashboard")(dashboard.dashboard)
app.command("report")(report.report)
app.command("probe")(probe.probe)
app.command("gc")(gc.gc)
app.add_typer(db.app, name="db")


def _version(value: bool) -> None:
    if value:
        print(f"route-tuner {__version__}")
        raise typer.Exit()


@app.callback()
def options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="More detail (each trial's whole route).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress: only the result and errors.")] = False,
) -> None:
    """Options before the command: `tuner -q run STUDY.toml`."""
    settings.verbose, settings.quiet = verbose, quiet


def main() -> None:
    """Console entry point: one clear line for every user-facing error (a JSON object under --json), exit status
    its `exit_code` (2 bad input, 3 environment, 130 interrupted)."""
    try:
        app()
    except TunerError as exc:
        _fail(str(exc), exc.exit_code)
    except SQLAlchemyError as exc:
        from tuner.store.urls import STORAGE_ENV, mask_credentials, scrub

        msg = mask_credentials(first_line(getattr(exc, "orig", None) or exc))
        for url in [arg for arg in sys.argv if "://" in arg] + [os.environ.get(STORAGE_ENV, "")]:
            msg = scrub(msg, url) if url else msg
        _fail(f"database: {msg}", DATABASE_EXIT)
    except KeyboardInterrupt:
        _fail("interrupted", 130)


def _fail(message: str, code: int) -> None:
    err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    if "--json" in sys.argv[1:]:
        print(json.dumps({"error": message, "exit_code": code}))
    sys.exit(code)
