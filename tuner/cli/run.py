"""`tuner run`: create or resume a study and work on it with a pool of workers until the budget is spent."""

from __future__ import annotations

import signal
import time
from typing import Annotated, Any

import optuna
import typer
from rich.live import Live
from rich.text import Text

from tuner.cli.common import SpecArg, StorageOpt, console, context, err_console, fmt_ms, fmt_x
from tuner.errors import TunerError
from tuner.store.db import db_retry, is_db_fault
from tuner.store.urls import mask_url
from tuner.study.gc import enforce_cap
from tuner.study.setup import Context, claim_device, prepare
from tuner.study.summary import Summary, summarize_study
from tuner.study.verdict import study_headline
from tuner.worker.pool import Pool


def run(
    spec: SpecArg,
    storage: StorageOpt = None,
    trials: Annotated[
        int | None, typer.Option("--trials", min=1, help="The study's TOTAL trial budget (not 'N more').")
    ] = None,
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="CPU worker processes.")] = None,
    gpus: Annotated[str | None, typer.Option("--gpus", help="Comma-separated GPU ids: one worker per GPU.")] = None,
    confirm: Annotated[
        bool, typer.Option("--confirm/--no-confirm", help="Re-measure the top routes against the default at the end.")
    ] = True,
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
) -> None:
    """Run (or resume) the study until its total trial budget is used up."""
    ctx = context(spec, storage)
    budget = trials or ctx.spec.run.budget
    gpu_list = [g.strip() for g in gpus.split(",") if g.strip()] if gpus else []
    study = prepare(ctx)
    if not gpu_list:
        claim_device(ctx)  # CPU workers share this machine: refuse other hardware here, once (GPU workers check theirs)
    study.set_user_attr("budget", budget)
    pool = Pool(ctx.spec.path, ctx.url, budget, workers or ctx.spec.run.workers, gpu_list)
    err_console.print(
        f"study {ctx.spec.study} on {mask_url(ctx.url)}: budget {budget}, {len(gpu_list) or pool.workers} worker(s)",
        highlight=False,
    )
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    pool.start()
    interrupted = False
    try:
        with Live(_progress(study), console=err_console, refresh_per_second=2, transient=False) as live:
            while pool.alive():
                time.sleep(0.5)  # display refresh cadence, not synchronisation
                live.update(_progress(study, live.renderable))
            live.update(_progress(study, live.renderable))
        if not err_console.is_terminal:
            err_console.line()  # Live ends its last line only on a terminal: keep the result off the progress line
    except KeyboardInterrupt:
        interrupted = True
        err_console.print("stopping: the trials in flight are marked interrupted and re-queued ...")
        pool.stop()
    finally:
        codes = pool.wait()
        signal.signal(signal.SIGTERM, previous)
    if interrupted or any(codes) or not confirm:
        _print_result(study)
    if interrupted:
        raise typer.Exit(130)
    if any(codes):
        raise TunerError(f"{sum(1 for c in codes if c)} worker(s) exited with an error (statuses {codes})")
    if confirm:
        _confirm(ctx, study, confirm_rounds, confirm_top_k, confirm_confidence)
        _print_result(study)
    collected = enforce_cap(ctx, study)  # after confirmation: the routes it measured are kept
    if collected:
        err_console.print(f"gc: {collected}", highlight=False, markup=False, soft_wrap=True)


def _confirm(ctx: Context, study: optuna.Study, rounds: int | None, top_k: int, confidence: float) -> None:
    """Confirm the winner in fresh interleaved processes, then print the verdict with its interval."""
    from tuner.study.note import update_note
    from tuner.worker.confirm import confirm

    err_console.print(f"confirming: re-measuring up to {top_k} candidate(s) against the default route ...")
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # so the child in flight is killed, not orphaned
    try:
        doc = confirm(
            ctx,
            study,
            rounds,
            top_k,
            confidence,
            log=lambda line: err_console.print(line, highlight=False, soft_wrap=True),
        )
    except KeyboardInterrupt:
        err_console.print("confirmation interrupted; run `tuner run` again to confirm")
        raise typer.Exit(130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    update_note(study)
    console.print(f"confirmation: {doc['message']}", highlight=False, soft_wrap=True)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _progress(study: optuna.Study, previous: Any = None) -> Any:
    """The progress line; while the database is unreachable, the previous one (the workers retry)."""
    try:
        return _table(summarize_study(study))
    except Exception as exc:
        if previous is None or not is_db_fault(exc):
            raise
        return previous


def _table(s: Summary) -> Text:
    done = s.complete + s.pruned + s.failed
    return Text(
        f"{s.study}: {done}/{s.budget} done | complete {s.complete} (feasible {s.feasible}) | pruned {s.pruned} | "
        f"failed {s.failed} | running {s.running} | re-queued {s.requeued} | cache hits {s.cache_hits} | "
        f"best {fmt_ms(s.best_ms)} | default {fmt_ms(s.default_ms)} | study estimate {fmt_x(s.speedup)} (unconfirmed)"
    )


def _print_result(study: optuna.Study) -> None:
    """The study's one conclusion (`tuner.study.verdict`) and the route it is about."""
    for attempt in db_retry():
        with attempt:
            s, head = study_headline(study)
    console.print(head.sentence, highlight=False, soft_wrap=True)
    if head.trial is not None:
        route = ", ".join(f"{k}={v}" for k, v in head.trial.params.items())
        measured = (head.trial.user_attrs.get("measured_ms") or {}).get("trial")
        console.print(
            f"  trial {head.trial.number}: {fmt_ms(measured)} in the study, default route {fmt_ms(s.default_ms)}\n"
            f"  route: {route}",
            highlight=False,
            soft_wrap=True,
        )
