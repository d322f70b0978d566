"""Study reports: PNG figures and one self-contained HTML page (`tuner report`)."""

from __future__ import annotations

from pathlib import Path

import optuna

from tuner.report.data import collect
from tuner.report.page import render
from tuner.report.plots import save_all
from tuner.study.setup import Context


def write_report(ctx: Context, study: optuna.Study, out: Path) -> Path:
    """Write `out/report.html` and its figures (`out/*.png`); returns the HTML path."""
    data = collect(ctx, study)
    figures = save_all(data, out)
    page = out / "report.html"
    page.write_text(render(data, figures), encoding="utf-8")
    return page
