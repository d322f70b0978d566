"""`tuner build`: build and measure one route outside any study (reproduces an exported winner)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Annotated

import typer

from tuner import job as J
from tuner.cli.common import JsonOpt, SpecArg, console, context, emit_json, fmt_ms
from tuner.errors import TunerError
from tuner.worker.isolate import run_isolated
from tuner.worker.jobs import make_job


def build(
    spec: SpecArg,
    route: Annotated[Path, typer.Option("--route", help="A route.json (as written by `tuner best --export`).")],
    out: Annotated[Path, typer.Option("--out", help="Directory for the engine and result.json.")],
    as_json: JsonOpt = False,
) -> None:
    """Build `route` in an isolated child, check its accuracy, time it, and keep the artifact in OUT."""
    ctx = context(spec, None)
    try:
        chosen = json.loads(route.read_text())
    except (OSError, ValueError) as exc:
        raise TunerError(f"{route}: not a readable route JSON file ({type(exc).__name__})") from exc
    reason = ctx.space.check(chosen)
    if reason:
        raise TunerError(f"{route}: known-invalid route: {reason}")
    out.mkdir(parents=True, exist_ok=True)
    res = run_isolated(make_job(ctx, chosen, out / "build"), out / "work")
    if res.artifact_path and Path(res.artifact_path).exists():
        shutil.copyfile(res.artifact_path, out / f"engine{Path(res.artifact_path).suffix}")
    (out / "result.json").write_text(res.to_json())
    latency = res.latency.get(ctx.spec.objective.statistic) if res.latency else None
    if as_json:
        emit_json(json.loads(res.to_json()))
    else:
        console.print(
            f"{res.status}: {ctx.spec.objective.statistic} {fmt_ms(latency)}, {ctx.spec.accuracy.metric} = "
            f"{res.accuracy} {res.message}",
            highlight=False,
        )
    if res.status != J.OK:
        raise typer.Exit(1)
