"""`tuner report`: a self-contained HTML report with PNG figures for one study."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tuner.cli.common import JsonOpt, SpecArg, StorageOpt, console, context, emit_json


def report(
    spec: SpecArg,
    out: Annotated[Path, typer.Option("--out", help="Directory for report.html and the PNG figures.")],
    storage: StorageOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write report.html (figures embedded) and the figures as PNG files into OUT (nothing else is written)."""
    from tuner.report import write_report

    ctx = context(spec, storage)
    page = write_report(ctx, ctx.load(), out)
    figures = sorted(p.name for p in out.glob("*.png"))
    if as_json:
        emit_json({"study": ctx.spec.study, "report": str(page), "figures": figures})
        return
    console.print(f"report for study {ctx.spec.study}: {page} ({len(figures)} figures)", highlight=False)
