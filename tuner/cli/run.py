"""`tuner run`: create or resume a study and work on it with a pool of workers until the budget is spent."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tuner.cli.common import (
    NO_SPEEDUP_EXIT,
    FailIfNoSpeedupOpt,
    JsonOpt,
    SpecArg,
    StorageOpt,
    console,
    emit_json,
    err_console,
    latency_line,
    settings,
    study,
)
from tuner.cli.progress import LOG_FORMATS, TEXT, Progress
from tuner.errors import Interrupted, TunerError, Unavailable
from tuner.store.db import is_db_fault
from tuner.study.verdict import SPEEDUP


def run(
    spec: SpecArg,
    storage: StorageOpt = None,
    trials: Annotated[
        int | None, typer.Option("--trials", min=1, help="The study's TOTAL trial budget (not 'N more').")
    ] = None,
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="CPU worker processes.")] = None,
    gpus: Annotated[str | None, typer.Option("--gpus", help="Comma-separated GPU ids: one worker per GPU.")] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            min=0.001,
            help="Wall-clock cap in seconds ([run] timeout_s): then stop, re-queue, give the verdict.",
        ),
    ] = None,
    confirm: Annotated[
        bool, typer.Option("--confirm/--no-confirm", help="Re-measure the top routes against the default at the end.")
    ] = True,
    reconfirm: Annotated[
        bool, typer.Option("--reconfirm", help="Confirm again even where the stored confirmation still holds.")
    ] = False,
    confirm_rounds: Annotated[
        int | None,
        typer.Option(
            "--confirm-rounds", min=1, help="Confirmation rounds (default: max(8, what the confidence needs))."
        ),
    ] = None,
    confirm_top_k: Annotated[
        int, typer.Option("--confirm-top-k", min=1, help="Candidates re-measured against the default.")
    ] = 3,
    confirm_confidence: Annotated[
        float,
        typer.Option("--confirm-confidence", min=0.5, max=0.999, help="Joint confidence of the speedup intervals."),
    ] = 0.95,
    log_format: Annotated[
        str, typer.Option("--log-format", help=f"Progress on stderr: {' or '.join(LOG_FORMATS)} (one object a line).")
    ] = TEXT,
    fail_if_no_speedup: FailIfNoSpeedupOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Run (or resume) the study until its total trial budget is used up; print the verdict."""
    if log_format not in LOG_FORMATS:
        raise TunerError(f"--log-format: expected {' or '.join(LOG_FORMATS)}, got {log_format!r}")
    chosen = study(spec, storage)
    gpu_list = [g.strip() for g in gpus.split(",") if g.strip()] if gpus else None
    try:
        with Progress(err_console, log_format, settings.quiet, settings.verbose) as progress:
            doc = chosen.run(
                trials,
                workers,
                gpu_list,
                timeout,
                confirm,
                [progress],
                reconfirm=reconfirm,
                confirm_rounds=confirm_rounds,
                confirm_top_k=confirm_top_k,
                confirm_confidence=confirm_confidence,
            )
    except Interrupted:
        if not as_json:
            _print_verdict_if_reachable(chosen)
        raise
    if as_json:
        emit_json(doc)
    else:
        _print_verdict(doc)
    if fail_if_no_speedup and doc["verdict"] != SPEEDUP:
        raise typer.Exit(NO_SPEEDUP_EXIT)


def _print_verdict_if_reachable(chosen: Any) -> None:
    """The verdict of `chosen` (a tuner.Study) after a stop, unless the database does not answer (a frozen
    server: one line says so)."""
    try:
        _print_verdict(chosen.status())
    except Exception as exc:
        if not (isinstance(exc, Unavailable) or is_db_fault(exc)):
            if isinstance(exc, TunerError):
                return  # nothing to show yet
            raise
        err_console.print("the database did not answer; `tuner status` shows the study once it does")


def _print_verdict(doc: dict[str, Any]) -> None:
    """The study's one conclusion and the route it is about."""
    console.print(doc["headline"], highlight=False, soft_wrap=True, markup=False)
    if doc.get("route") is not None:
        route = ", ".join(f"{k}={v}" for k, v in doc["route"].items())
        console.print(
            f"{latency_line(doc)}\n  route: {route}",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
    if doc.get("confirmation"):
        console.print(f"confirmation: {doc['confirmation']['message']}", highlight=False, soft_wrap=True, markup=False)
