"""`tuner report`: a self-contained HTML report with PNG figures for one study."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tuner.cli.common import SpecArg, StorageOpt, console, context


def report(
    spec: SpecArg,
    out: Annotated[Path, typer.Option("--out", help="Directory for report.html and the PNG figures.")],
    storage: StorageOpt = None,
) -> None:
    """Write report.html (figures embedded) and the figures as PNG files into OUT."""
    from tuner.report import write_report

    ctx = context(spec, storage)
    page = write_report(ctx, ctx.load(), out)
    console.print(
        f"report for study {ctx.spec.study}: {page} ({len(list(out.glob('*.png')))} figures)", highlight=False
    )
