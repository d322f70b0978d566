"""`tuner status`, `tuner best` (with `--export`) and `tuner space`."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from tuner.backends.base import Backend
from tuner.cli.common import JsonOpt, SpecArg, StorageOpt, console, context, fmt_ms, fmt_x
from tuner.errors import TunerError
from tuner.store.cache import ResultStore
from tuner.study.outcome import is_feasible
from tuner.study.summary import summarize_study


def status(spec: SpecArg, storage: StorageOpt = None, as_json: JsonOpt = False) -> None:
    """Counts by state, best feasible so far, speedup over the default route, elapsed time."""
    ctx = context(spec, storage)
    s = summarize_study(ctx.load())
    if as_json:
        print(json.dumps(s.status_json()))
        return
    t = Table(title=f"study {s.study}", show_header=False)
    for label, value in (
        ("budget", s.budget), ("complete", s.complete), ("  feasible", s.feasible), ("pruned (accuracy gate)", s.pruned),
        ("failed", s.failed), ("running", s.running), ("waiting", s.waiting), ("re-queued (lost/interrupted)", s.requeued),
        ("cache hits", s.cache_hits), ("failure classes", ", ".join(f"{k}: {v}" for k, v in sorted(s.failure_classes.items())) or "-"),
        ("best feasible", f"{fmt_ms(s.best_value)} (trial {s.best.number})" if s.best else "-"),
        ("default route", fmt_ms(s.baseline_value)), ("speedup", fmt_x(s.speedup)), ("elapsed", f"{s.elapsed_s:.1f} s"),
    ):
        t.add_row(label, str(value))
    console.print(t)


def best_document(ctx: Any) -> dict[str, Any]:
    """The stable `tuner best --json` document for the best feasible trial."""
    study = ctx.load()
    s = summarize_study(study)
    if s.best is None:
        raise TunerError(f"study {s.study!r} has no feasible trial yet")
    acc = s.best.user_attrs.get("accuracy", {})
    return {
        "study": s.study, "trial": s.best.number, "route": s.best.params, "value": s.best_value,
        "baseline_value": s.baseline_value, "speedup": s.speedup,
        "accuracy": {"metric": acc.get("metric", ctx.spec.accuracy.metric), "value": acc.get("value"), "tolerance": ctx.spec.accuracy.tolerance},
        "feasible": is_feasible(s.best), "statistic": ctx.spec.objective.statistic, "unit": "ms",
        "latency_ms": s.best.user_attrs.get("latency_ms"), "artifact_sha256": s.best.user_attrs.get("artifact_sha256"),
        "baseline_trial": s.baseline.number if s.baseline else None, "confirmation": study.user_attrs.get("confirmation"),
    }


def best(
    spec: SpecArg, storage: StorageOpt = None, as_json: JsonOpt = False,
    export: Annotated[Path | None, typer.Option("--export", help="Write the artifact, route and a reproduction command here.")] = None,
) -> None:
    """The best *feasible* trial (never one that breaks the tolerance)."""
    ctx = context(spec, storage)
    doc = best_document(ctx)
    if export is not None:
        _export(ctx, doc, export)
    if as_json:
        print(json.dumps(doc))
        return
    route = ", ".join(f"{k}={v}" for k, v in doc["route"].items())
    console.print(f"best feasible: trial {doc['trial']}  {fmt_ms(doc['value'])}  speedup {fmt_x(doc['speedup'])} over the default "
                  f"({fmt_ms(doc['baseline_value'])})\n  {doc['accuracy']['metric']} = {doc['accuracy']['value']} "
                  f"(tolerance {doc['accuracy']['tolerance']})\n  route: {route}", highlight=False)
    console.print(f"  confirmation: {_confirmation_text(doc)}", highlight=False, soft_wrap=True)


def _confirmation_text(doc: dict[str, Any]) -> str:
    """The confirmation verdict with its interval, flagged when it predates the current best trial."""
    conf = doc.get("confirmation")
    if not conf:
        return "none yet (`tuner run` re-measures the top routes against the default when the budget is spent)"
    if conf.get("study_best_trial") != doc["trial"]:
        return f"{conf['message']} [made when the best trial was {conf.get('study_best_trial')}; run `tuner run` again to re-confirm]"
    return str(conf["message"])


def _export(ctx: Any, doc: dict[str, Any], out: Path) -> None:
    """Copy the winner's artifact and write route.json, best.json and reproduce.sh into `out`."""
    sha = doc.get("artifact_sha256")
    record = ResultStore(ctx.url).artifact(sha) if sha else None
    if record is None or not Path(record.path).exists():
        raise TunerError(f"the artifact of trial {doc['trial']} is not in this machine's work dir ({ctx.work_dir}); export it where the study ran")
    out.mkdir(parents=True, exist_ok=True)
    artifact = out / f"engine{Path(record.path).suffix}"
    shutil.copyfile(record.path, artifact)
    (out / "route.json").write_text(json.dumps(doc["route"], indent=2, sort_keys=True) + "\n")
    (out / "best.json").write_text(json.dumps(doc, indent=2) + "\n")
    cmd = f"tuner build {shlex.quote(str(ctx.spec.path))} --route {shlex.quote(str((out / 'route.json').resolve()))} --out {shlex.quote(str(out.resolve() / 'rebuilt'))}"
    native = ctx.backend.reproduce_command(doc["route"])
    lines = ["#!/bin/sh", "# Rebuild and re-measure the winning route (ship engine file itself: rebuilds may differ).", cmd]
    if native:
        lines += ["# Native equivalent:", f"# {native}"]
    script = out / "reproduce.sh"
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    console.print(f"exported trial {doc['trial']} to {out}: {artifact.name} (sha256 {sha[:12]}), route.json, reproduce.sh")


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
    console.print(options_table(ctx.backend, ctx.spec.backend.options))


def options_table(backend: Backend, chosen: dict[str, Any]) -> Table:
    """The backend's declared [backend.options]: accepted values, default, the study's value, what each does."""
    t = Table(title=f"{backend.name} backend options")
    for col in ("option", "values", "default", "study", "about"):
        t.add_column(col)
    for o in backend.options:
        t.add_row(o.name, o.kind(), repr(o.default), repr(chosen[o.name]) if o.name in chosen else "-", o.doc)
    return t
