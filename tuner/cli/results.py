"""`tuner status`, `tuner best` (with `--export`) and `tuner space`."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Annotated, Any

import optuna
import typer
from optuna.trial import FrozenTrial
from rich.table import Table

from tuner.backends.base import Backend
from tuner.cli.common import JsonOpt, SpecArg, StorageOpt, console, context, err_console, fmt_ms
from tuner.errors import TunerError
from tuner.measure.inputs import file_hash
from tuner.store.cache import ResultStore
from tuner.study.outcome import is_feasible
from tuner.study.verdict import SPEEDUP, UNCONFIRMED, Estimate, Headline, study_headline


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
        ("budget", s.budget), ("complete", s.complete), ("  feasible", s.feasible), ("pruned (accuracy gate)", s.pruned),
        ("failed", s.failed), ("running", s.running), ("waiting", s.waiting), ("re-queued (lost/interrupted)", s.requeued),
        ("cache hits", s.cache_hits), ("failure classes", ", ".join(f"{k}: {v}" for k, v in sorted(s.failure_classes.items())) or "-"),
        ("best feasible", f"{fmt_ms(s.best_value)} (trial {s.best.number})" if s.best else "-"),
        ("default route", fmt_ms(s.baseline_value)), ("verdict", head.verdict),
        ("speedup", _estimate_text(head.estimate, head)), ("study's own estimate", _estimate_text(head.study, head)),
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
        "study": s.study, "trial": trial.number, "route": trial.params, "value": trial.value,
        "baseline_value": s.baseline_value,
        "accuracy": {"metric": acc.get("metric", ctx.spec.accuracy.metric), "value": acc.get("value"), "tolerance": ctx.spec.accuracy.tolerance},
        "feasible": is_feasible(trial), "statistic": ctx.spec.objective.statistic, "unit": "ms",
        "latency_ms": trial.user_attrs.get("latency_ms"), "artifact_sha256": trial.user_attrs.get("artifact_sha256"),
        "artifact_bytes": trial.user_attrs.get("artifact_bytes"), "peak_memory_mb": trial.user_attrs.get("peak_memory_mb"),
        "memory_kind": trial.user_attrs.get("memory_kind"), "max_memory_mb": ctx.spec.objective.max_memory_mb,
        "baseline_trial": s.baseline.number if s.baseline else None, "study_best_trial": s.best.number, "confirmation": confirmation,
        **head.to_json(),
    }
    return doc, head


def best(
    spec: SpecArg, storage: StorageOpt = None, as_json: JsonOpt = False,
    export: Annotated[Path | None, typer.Option("--export", help="Write what the verdict says (the confirmed winner, else the default route) here.")] = None,
    trial: Annotated[int | None, typer.Option("--trial", min=0, help="With --export: export this feasible trial instead, confirmed or not.")] = None,
) -> None:
    """The study's verdict and the route it is about (never one that breaks the tolerance)."""
    if trial is not None and export is None:
        raise TunerError("--trial N only chooses what --export writes; add --export DIR")
    ctx = context(spec, storage)
    study = ctx.load()
    doc, head = best_document(ctx, study)
    if export is not None:
        _export(ctx, doc, _export_choice(study, head, trial), export)
    if as_json:
        print(json.dumps(doc))
        return
    console.print(head.sentence, highlight=False, soft_wrap=True)
    route = ", ".join(f"{k}={v}" for k, v in doc["route"].items())
    study_line = f"; the study's own estimate {head.study.text()}" if head.study and head.verdict != UNCONFIRMED else ""
    console.print(f"  trial {doc['trial']}: {fmt_ms(doc['value'])} in the study, default route {fmt_ms(doc['baseline_value'])}{study_line}\n"
                  f"  {doc['accuracy']['metric']} = {doc['accuracy']['value']} (tolerance {doc['accuracy']['tolerance']})\n"
                  f"  route: {route}", highlight=False, soft_wrap=True)
    console.print(f"  confirmation: {_confirmation_text(doc)}", highlight=False, soft_wrap=True)


def _export_choice(study: optuna.Study, head: Headline, asked: int | None) -> tuple[FrozenTrial, str]:
    """The trial `--export` writes and why: the one asked for, else what the verdict says."""
    if asked is not None:
        chosen = next((t for t in study.get_trials(deepcopy=False) if t.number == asked), None)
        if chosen is None or not is_feasible(chosen):
            raise TunerError(f"--trial {asked}: no feasible trial with that number in study {study.study_name!r}")
        return chosen, f"trial {asked} as asked for with --trial (verdict: {head.verdict})"
    if head.export_trial is None:
        best = f"trial {head.trial.number}" if head.trial else "no route"
        raise TunerError(f"not exporting: the study's verdict is {head.verdict} ({best} is not confirmed); run `tuner run` to confirm, "
                         f"or export it anyway with --trial {head.trial.number if head.trial else 'N'}")
    chosen = next(t for t in study.get_trials(deepcopy=False) if t.number == head.export_trial)
    if head.verdict == SPEEDUP:
        return chosen, f"the confirmed winner, trial {chosen.number}"
    return chosen, f"the default route, trial {chosen.number}: the verdict is {head.verdict}"


def _confirmation_text(doc: dict[str, Any]) -> str:
    """The confirmation verdict with its interval, flagged when it predates the current best trial."""
    conf = doc.get("confirmation")
    if not conf:
        return "none yet (`tuner run` re-measures the top routes against the default when the budget is spent)"
    if conf.get("study_best_trial") != doc["study_best_trial"]:
        return f"{conf['message']} [made when the best trial was {conf.get('study_best_trial')}; run `tuner run` again to re-confirm]"
    return str(conf["message"])


def _export(ctx: Any, doc: dict[str, Any], choice: tuple[FrozenTrial, str], out: Path) -> None:
    """Copy the chosen trial's artifact and write route.json, best.json and reproduce.sh into `out`."""
    trial, reason = choice
    sha = trial.user_attrs.get("artifact_sha256")
    record = ResultStore(ctx.url).artifact(sha) if sha else None
    if record is None or not Path(record.path).exists():
        raise TunerError(f"the artifact of trial {trial.number} is not in this machine's work dir ({ctx.work_dir}); export it where the study ran")
    out.mkdir(parents=True, exist_ok=True)
    artifact = out / f"engine{Path(record.path).suffix}"
    partial = artifact.with_name(artifact.name + ".partial")
    shutil.copyfile(record.path, partial)
    found = file_hash(partial)  # the copy is what is checked: nothing can change between check and copy
    if found != sha:
        partial.unlink()
        raise TunerError(f"{record.path}: the artifact of trial {trial.number} has changed since it was recorded "
                         f"(sha256 {found[:12]}, expected {sha[:12]}); not exported, rebuild it with `tuner build`")
    partial.replace(artifact)
    exported = {"trial": trial.number, "route": trial.params, "artifact_sha256": sha, "value": trial.value, "reason": reason}
    (out / "route.json").write_text(json.dumps(trial.params, indent=2, sort_keys=True) + "\n")
    (out / "best.json").write_text(json.dumps({**doc, "exported": exported}, indent=2) + "\n")
    cmd = f"tuner build {shlex.quote(str(ctx.spec.path))} --route {shlex.quote(str((out / 'route.json').resolve()))} --out {shlex.quote(str(out.resolve() / 'rebuilt'))}"
    native = ctx.backend.reproduce_command(trial.params)
    lines = ["#!/bin/sh", "# Rebuild and re-measure the exported route (ship engine file itself: rebuilds may differ).", cmd]
    if native:
        lines += ["# Native equivalent:", f"# {native}"]
    script = out / "reproduce.sh"
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    err_console.print(f"exported {reason} to {out}: {artifact.name} (sha256 {sha[:12]}), route.json, reproduce.sh", highlight=False, soft_wrap=True)


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
