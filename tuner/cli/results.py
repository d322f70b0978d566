"""`tuner status`, `tuner best` (with `--export`) and `tuner space`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import optuna
import typer
from rich.table import Table

from tuner.backends.base import Backend
from tuner.cli.common import JsonOpt, SpecArg, StorageOpt, console, context, err_console, fmt_ms
from tuner.errors import TunerError
from tuner.export import export_choice, export_trial, machine_share, measured_shapes, route_space
from tuner.export.describe import change_lines
from tuner.study.outcome import is_feasible
from tuner.study.verdict import UNCONFIRMED, Estimate, Headline, study_headline


def status(spec: SpecArg, storage: StorageOpt = None, as_json: JsonOpt = False) -> None:
    """The study's verdict, counts by state, best feasible so far, speedup over the default route, elapsed time."""
    ctx = context(spec, storage)
    study = ctx.load()
    s, head = study_headline(study)
    if as_json:
        print(json.dumps({**s.status_json(), **head.to_json()}))
        return
    console.print(head.sentence, highlight=False, soft_wrap=True)
    t = Table(title=f"study {s.study}", show_header=False)
    for label, value in (
        ("budget", s.budget),
        ("complete", s.complete),
        ("  feasible", s.feasible),
        ("pruned (accuracy gate)", s.pruned),
        ("failed", s.failed),
        ("running", s.running),
        ("waiting", s.waiting),
        ("re-queued (lost/interrupted)", s.requeued),
        ("cache hits", s.cache_hits),
        ("failure classes", ", ".join(f"{k}: {v}" for k, v in sorted(s.failure_classes.items())) or "-"),
        ("best feasible", f"{fmt_ms(s.best_ms)} (trial {s.best.number})" if s.best else "-"),
        ("default route", fmt_ms(s.default_ms)),
        ("verdict", head.verdict),
        ("speedup", _estimate_text(head.estimate, head)),
        ("study's own estimate", _estimate_text(head.study, head)),
        ("elapsed", f"{s.elapsed_s:.1f} s"),
    ):
        t.add_row(label, str(value))
    console.print(t)


def _estimate_text(est: Estimate | None, head: Headline) -> str:
    return "-" if est is None or head.trial is None else f"{est.text()} for trial {head.trial.number}"


def best_document(ctx: Any, study: optuna.Study | None = None) -> tuple[dict[str, Any], Headline]:
    """The stable `tuner best --json` document about the route the verdict is about, and the verdict."""
    study = study or ctx.load()
    s, head = study_headline(study)
    if s.best is None:
        raise TunerError(f"study {s.study!r} has no feasible trial yet")
    confirmation = study.user_attrs.get("confirmation")
    trial = head.trial or s.best
    acc = trial.user_attrs.get("accuracy", {})
    doc = {
        "study": s.study,
        "trial": trial.number,
        "route": trial.params,
        "value": trial.value,
        "baseline_value": s.baseline_value,
        "measured_ms": trial.user_attrs.get("measured_ms"),
        "default_ms": s.default_ms,
        "contention": (confirmation or {}).get("contention"),
        "accuracy": {
            "metric": acc.get("metric", ctx.spec.accuracy.metric),
            "value": acc.get("value"),
            "tolerance": ctx.spec.accuracy.tolerance,
        },
        "feasible": is_feasible(trial),
        "statistic": ctx.spec.objective.statistic,
        "unit": "ms",
        "latency_ms": trial.user_attrs.get("latency_ms"),
        "artifact_sha256": trial.user_attrs.get("artifact_sha256"),
        "artifact_bytes": trial.user_attrs.get("artifact_bytes"),
        "peak_memory_mb": trial.user_attrs.get("peak_memory_mb"),
        "memory_kind": trial.user_attrs.get("memory_kind"),
        "max_memory_mb": ctx.spec.objective.max_memory_mb,
        "shapes": measured_shapes(ctx, trial),
        "machine_share": machine_share(ctx, trial),
        "baseline_trial": s.baseline.number if s.baseline else None,
        "study_best_trial": s.best.number,
        "confirmation": confirmation,
        **head.to_json(),
    }
    return doc, head


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
) -> None:
    """The study's verdict and the route it is about (never one that breaks the tolerance)."""
    if trial is not None and export is None:
        raise TunerError("--trial N only chooses what --export writes; add --export DIR")
    ctx = context(spec, storage)
    study = ctx.load()
    doc, head = best_document(ctx, study)
    if export is not None:
        message = export_trial(ctx, doc, export_choice(study, head, trial), export)
        err_console.print(message, highlight=False, soft_wrap=True)
    if as_json:
        print(json.dumps(doc))
        return
    console.print(head.sentence, highlight=False, soft_wrap=True)
    study_line = f"; the study's own estimate {head.study.text()}" if head.study and head.verdict != UNCONFIRMED else ""
    changed = change_lines(doc["route"], dict(study.user_attrs.get("default_route") or {}), route_space(ctx))
    measured = (doc["measured_ms"] or {}).get("trial")
    console.print(
        f"  trial {doc['trial']}: {fmt_ms(measured)} in the study, default route "
        f"{fmt_ms(doc['default_ms'])}{study_line}\n  {doc['accuracy']['metric']} = {doc['accuracy']['value']} "
        f"(tolerance {doc['accuracy']['tolerance']})\n  changes from the default route:\n"
        + "\n".join(f"    {line}" for line in changed),
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"  confirmation: {_confirmation_text(doc)}", highlight=False, soft_wrap=True)


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


def space(spec: SpecArg) -> None:
    """List the search space the study would explore on this machine."""
    ctx = context(spec, None)
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
    steps = ctx.backend.preparation(ctx.model_info, ctx.space, ctx.work_dir, log=lambda _: None)
    if steps:
        console.print("model preparation before int8 variants (once, cached by content):")
        for step in steps:
            console.print(f"  {step['step']}: {step['status']} {step.get('detail', '')}".rstrip(), highlight=False)
    console.print(options_table(ctx.backend, ctx.spec.backend.options))


def options_table(backend: Backend, chosen: dict[str, Any]) -> Table:
    """The backend's declared [backend.options]: accepted values, default, the study's value, what each does."""
    t = Table(title=f"{backend.name} backend options")
    for col in ("option", "values", "default", "study", "about"):
        t.add_column(col)
    for o in backend.options:
        t.add_row(o.name, o.kind(), repr(o.default), repr(chosen[o.name]) if o.name in chosen else "-", o.doc)
    return t
