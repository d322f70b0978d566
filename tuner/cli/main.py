"""`tuner`: run, inspect and export route-tuning studies."""

from __future__ import annotations

import os
import sys

import typer
from sqlalchemy.exc import SQLAlchemyError

from tuner.cli import build, dashboard, db, gc, probe, report, results, run
from tuner.cli.common import err_console
from tuner.errors import TunerError, first_line

app = typer.Typer(
    help="Find the fastest engine for an ONNX model within an accuracy tolerance.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command("run")(run.run)
app.command("status")(results.status)
app.command("best")(results.best)
app.command("space")(results.space)
app.command("build")(build.build)
app.command("dashboard")(dashboard.dashboard)
app.command("report")(report.report)
app.command("probe")(probe.probe)
app.command("gc")(gc.gc)
app.add_typer(db.app, name="db")


def main() -> None:
    """Console entry point: one clear line for every user-facing error, exit status its `exit_code` (2: bad input)."""
    try:
        app()
    except TunerError as exc:
        err_console.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except SQLAlchemyError as exc:
        from tuner.store.urls import STORAGE_ENV, mask_credentials, scrub

        msg = mask_credentials(first_line(getattr(exc, "orig", None) or exc))
        for url in [arg for arg in sys.argv if "://" in arg] + [os.environ.get(STORAGE_ENV, "")]:
            msg = scrub(msg, url) if url else msg
        err_console.print(f"error: database: {msg}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
