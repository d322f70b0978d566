"""`tuner status`, `tuner best` (with `--export`), `tuner trials` and `tuner space`."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from tuner.backends.base import Backend
from tuner.cli.common import (
    NO_SPEEDUP_EXIT,
    FailIfNoSpeedupOpt,
    JsonOpt,
    SpecArg,
    StorageOpt,
    console,
    context,
    emit_json,
    err_console,
    fmt_ms,
    latency_line,
    study,
)
from tuner.errors import TunerError
from tuner.export import route_space
from tuner.export.describe import change_lines
from tuner.space import SearchSpace
from tuner.study.verdict import SPEEDUP, UNCONFIRMED, Estimate

FINISHED = ("complete", "pruned", "fail")


def status(spec: SpecArg, storage: StorageOpt = None, as_json: JsonOpt = False) -> None:
    """The study's verdict, counts by state, best feasible so far, speedup over the default route, elapsed time."""
    doc = study(spec, storage).status()
    if as_json:
        emit_json(doc)
        return
    console.print(doc["headline"], highlight=False, soft_wrap=True, markup=False)
    best = doc["best_trial"]
    t = Table(title=f"study {doc['study']}", show_header=False)
    for label, value in (
        ("budget", doc["budget"]),
        ("complete", doc["complete"]),
        ("  feasible", doc["feasible"]),
        ("pruned (accuracy gate, slow)", doc["pruned"]),
        ("failed", doc["failed"]),
        ("running", doc["running"]),
        ("waiting", doc["waiting"]),
        ("re-queued (lost/interrupted)", doc["requeued"]),
        ("cache hits", doc["cache_hits"]),
        ("failure classes", ", ".join(f"{k}: {v}" for k, v in sorted(doc["failure_classes"].items())) or "-"),
        ("best feasible", _best_text(doc) if best is not None else "-"),
        ("default route (median as measured)", fmt_ms(doc["default_ms"])),
        ("verdict", doc["verdict"]),
        ("speedup", _speedup_text(doc["speedup"], doc["speedup_ci"], doc["verdict_trial"])),
        ("study's own estimate", _speedup_text(doc["study_speedup"], doc["study_speedup_ci"], doc["verdict_trial"])),
        ("elapsed", f"{doc['elapsed_s']:.1f} s (confirmation {doc['confirm_s']:.1f} s)"),
    ):
        t.add_row(label, str(value))
    console.print(t)


def _best_text(doc: dict[str, Any]) -> str:
    """`9.621 ms (trial 1; the default route 10.402 ms beside it)`: both from the trial's own timing."""
    beside = doc["best_default_ms"]
    tail = f"; the default route {fmt_ms(beside)} beside it" if beside is not None and beside != doc["best_ms"] else ""
    return f"{fmt_ms(doc['best_ms'])} (trial {doc['best_trial']}{tail})"


def _speedup_text(speedup: float | None, ci: list[float] | None, trial: int | None) -> str:
    if speedup is None or trial is None:
        return "-"
    return Estimate(speedup, *(ci or (None, None)), paired=ci is not None).text() + f" for trial {trial}"


def best(
    spec: SpecArg,
    storage: StorageOpt = None,
    as_json: JsonOpt = False,
    export: Annotated[
        Path | None,
        typer.Option(
            "--export", help="Write what the verdict says (the confirmed winner, else the default route) here."
        ),
    ] = None,
    trial: Annotated[
        int | None,
        typer.Option("--trial", min=0, help="With --export: export this feasible trial instead, confirmed or not."),
    ] = None,
    fail_if_no_speedup: FailIfNoSpeedupOpt = False,
) -> None:
    """The study's verdict and the route it is about (never one that breaks the tolerance)."""
    if trial is not None and export is None:
        raise TunerError("--trial N only chooses what --export writes; add --export DIR")
    chosen = study(spec, storage)
    doc = chosen.best()
    if export is not None:
        err_console.print(chosen.export(export, trial), highlight=False, soft_wrap=True, markup=False)
    if as_json:
        emit_json(doc)
    else:
        _print_best(doc, route_space(chosen.context()))
    if fail_if_no_speedup and doc["verdict"] != SPEEDUP:
        raise typer.Exit(NO_SPEEDUP_EXIT)


def _print_best(doc: dict[str, Any], space_: SearchSpace | None) -> None:
    console.print(doc["headline"], highlight=False, soft_wrap=True, markup=False)
    own = doc["study_speedup"]
    study_line = ""
    if own is not None and doc["verdict"] != UNCONFIRMED:
        ci = doc["study_speedup_ci"]
        study_line = f"; the study's own estimate {Estimate(own, *(ci or (None, None)), paired=ci is not None).text()}"
    changed = change_lines(doc["route"], doc["default_route"], space_)
    console.print(
        f"{latency_line(doc)}{study_line}\n"
        f"  {doc['accuracy']['metric']} = {doc['accuracy']['value']} (tolerance {doc['accuracy']['tolerance']})\n"
        f"  changes from the default route:\n" + "\n".join(f"    {line}" for line in changed),
        highlight=False,
        soft_wrap=True,
        markup=False,
    )
    console.print(f"  confirmation: {_confirmation_text(doc)}", highlight=False, soft_wrap=True, markup=False)


def _confirmation_text(doc: dict[str, Any]) -> str:
    """The confirmation verdict with its interval, flagged when it predates the current best trial."""
    conf = doc.get("confirmation")
    if not conf:
        return "none yet (`tuner run` re-measures the top routes against the default when the budget is spent)"
    if conf.get("study_best_trial") != doc["study_best_trial"]:
        return (
            f"{conf['message']} [made when the best trial was {conf.get('study_best_trial')}; run `tuner run` "
            "again to re-confirm]"
        )
    return str(conf["message"])


def space(spec: SpecArg, as_json: JsonOpt = False) -> None:
    """List the search space the study would explore on this machine (writes nothing)."""
    ctx = context(spec, None)
    with tempfile.TemporaryDirectory(prefix="tuner-space-") as scratch:  # the preparation's products are dropped
        steps = ctx.backend.preparation(ctx.model_info, ctx.space, Path(scratch), log=lambda _: None)
    if as_json:
        emit_json(
            {
                "backend": ctx.spec.backend.name,
                "params": [
                    {"name": p.name, "choices": list(p.choices), "default": p.default, "about": p.help, "why": p.why}
                    for p in ctx.space.params
                ],
                "routes": len(ctx.space.routes()),
                "preparation": steps,
                "options": {o.name: ctx.spec.backend.options.get(o.name, o.default) for o in ctx.backend.options},
            }
        )
        return
    t = Table(title=f"{ctx.spec.backend.name} routes for {ctx.spec.model.path.name}")
    for col in ("parameter", "choices", "default", "about"):
        t.add_column(col)
    for p in ctx.space.params:
        t.add_row(p.name, ", ".join(map(str, p.choices)), str(p.default), p.help)
    console.print(t)
    console.print(f"{len(ctx.space.routes())} routes")
    for p in ctx.space.params:  # why some values are not offered for this model (e.g. it is already quantized)
        if p.why:
            console.print(f"{p.name}: {p.why}", highlight=False, markup=False)
    if steps:
        console.print("model preparation before int8 variants (cached by content when a study runs):")
        for step in steps:
            console.print(f"  {step['step']}: {step['status']} {step.get('detail', '')}".rstrip(), highlight=False)
    console.print(options_table(ctx.backend, ctx.spec.backend.options))


def trials(
    spec: SpecArg,
    storage: StorageOpt = None,
    as_json: JsonOpt = False,
    failed: Annotated[
        bool, typer.Option("--failed", help="Only the trials that did not give a feasible route.")
    ] = False,
) -> None:
    """List the study's trials: outcome, what each route changes from the default, speedup, message."""
    rows = study(spec, storage).trials()
    if failed:
        rows = [r for r in rows if r["state"] in FINISHED and r["outcome"] != "feasible"]
    if as_json:
        emit_json(rows)
        return
    t = Table(title=f"{len(rows)} trial(s)")
    for col in ("trial", "outcome", "changes from the default route", "ms (default beside it)", "speedup", "message"):
        t.add_column(col)
    for r in rows:
        changes = ", ".join(f"{k}={v}" for k, v in r["changes"].items()) or "(default route)"
        speedup = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        t.add_row(str(r["number"]), r["outcome"], changes, pair_ms(r), speedup, r["message"])
    console.print(t)


def pair_ms(row: dict[str, Any]) -> str:
    """`4.246 (4.210)`: a trial's measured milliseconds and, where it is not the default route, the default's timed
    beside it; `-` where the timing was contended or did not happen."""
    ms, default = row["latency_ms"], row["default_ms"]
    if ms is None:
        return "-"
    return f"{ms:.3f}" + ("" if default is None or not row["changes"] else f" ({default:.3f})")


def options_table(backend: Backend, chosen: dict[str, Any]) -> Table:
    """The backend's declared [backend.options]: accepted values, default, the study's value, what each does."""
    t = Table(title=f"{backend.name} backend options")
    for col in ("option", "values", "default", "study", "about"):
        t.add_column(col)
    for o in backend.options:
        t.add_row(o.name, o.kind(), repr(o.default), repr(chosen[o.name]) if o.name in chosen else "-", o.doc)
    return t
