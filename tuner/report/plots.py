"""The report's figures (matplotlib's object API with the Agg canvas: no display, no global state)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from tuner import job as J
from tuner.report.data import ReportData, TrialRow

FEASIBLE, INFEASIBLE, DEFAULT, WINNER, STOPPED = "#1f77b4", "#d62728", "#7f7f7f", "#2ca02c", "#9467bd"
OUTCOME_COLORS = {"feasible": FEASIBLE, "infeasible": INFEASIBLE, "accuracy-gate": "#ff7f0e", "accuracy": INFEASIBLE}
DPI = 110


def _figure(width: float = 8.0, height: float = 4.5) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    return fig, fig.add_subplot()


def _message(ax: Axes, text: str) -> None:
    """Say why a plot is empty instead of drawing an empty frame."""
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes, fontsize=11, color="#444444")
    ax.set_axis_off()


def _timed(data: ReportData) -> list[TrialRow]:
    return [t for t in data.trials if t.value is not None]


def _latency(t: TrialRow) -> float:
    """A timed trial's latency as its own uncontended timing measured it (NaN, which matplotlib skips, for an untimed
    or contended one)."""
    return t.latency_ms if t.latency_ms is not None else math.nan


def _latency_axis(ax: Axes, data: ReportData, values: list[float]) -> None:
    """Label the latency axis; a log scale when slow outliers would flatten everything else."""
    positive = [v for v in values if v > 0]
    log = bool(positive) and max(positive) / min(positive) > 20
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(f"{data.statistic} latency (ms)" + (", log scale" if log else ""))


def _was_stopped(t: TrialRow) -> bool:
    """Whether the trial's timing stopped early as slower than the incumbent (`slow`): it has no value, but its own
    timing measured it."""
    return t.outcome == J.SLOW and t.latency_ms is not None


def _stopped(data: ReportData) -> list[TrialRow]:
    return [t for t in data.trials if _was_stopped(t)]


def _untimed(data: ReportData) -> list[TrialRow]:
    """Trials never timed: failed, or rejected by the accuracy gate."""
    return [t for t in data.trials if t.value is None and not _was_stopped(t)]


def history(data: ReportData) -> Figure:
    """Latency per trial, feasible vs infeasible vs stopped early as slow, with the best feasible so far and the
    default route."""
    fig, ax = _figure()
    timed, stopped = _timed(data), _stopped(data)
    if not timed and not stopped:
        _message(ax, "no trial has been timed yet")
        return fig
    for feasible, color, marker, label in (
        (True, FEASIBLE, "o", "feasible"),
        (False, INFEASIBLE, "x", "infeasible (over tolerance)"),
    ):
        pts = [t for t in timed if t.feasible == feasible]
        if pts:
            ax.scatter(
                [t.number for t in pts], [_latency(t) for t in pts], c=color, marker=marker, s=28, label=label, zorder=3
            )
    if stopped:
        ax.scatter(
            [t.number for t in stopped],
            [_latency(t) for t in stopped],
            c=STOPPED,
            marker="v",
            s=28,
            label="stopped early while timed: slower than the incumbent",
            zorder=3,
        )
    best, xs, ys = None, [], []
    for t in sorted(data.trials, key=lambda t: t.number):
        if t.feasible and t.latency_ms is not None and (best is None or t.latency_ms < best):
            best = t.latency_ms
        if best is not None:
            xs.append(t.number)
            ys.append(best)
    if xs:
        ax.step(xs, ys, where="post", color=WINNER, lw=1.8, label="best feasible so far")
    if data.summary.default_ms is not None:
        ax.axhline(
            data.summary.default_ms,
            color=DEFAULT,
            ls="--",
            lw=1.2,
            label=f"default route (median as measured, {data.summary.default_ms:.4g} ms)",
        )
    untimed = _untimed(data)
    if untimed:
        ax.plot(
            [t.number for t in untimed],
            [0] * len(untimed),
            "|",
            color="#ff7f0e",
            ms=14,
            mew=2,
            transform=ax.get_xaxis_transform(),
            label=f"not timed: failed or gate-rejected ({len(untimed)})",
            clip_on=False,
        )
    ax.set(title=f"Optimisation history: {data.study}", xlabel="trial number")
    _latency_axis(ax, data, [_latency(t) for t in timed + stopped])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return fig


def latency_distribution(data: ReportData) -> Figure:
    """Raw latency samples of the default route and the trial compared with it."""
    fig, ax = _figure()
    base = data.summary.baseline
    same = base is not None and data.contender == base.number
    series = [(f"default (trial {base.number})" if base else "default", data.samples.get("default", []), DEFAULT)]
    if not same:
        series.append((f"{data.contender_role} (trial {data.contender})", data.samples.get("contender", []), WINNER))
    series = [s for s in series if s[1]]
    if not series:
        _message(ax, "no raw latency samples stored for the default route or the best route")
        return fig
    values = np.concatenate([np.asarray(s[1]) for s in series])
    lo, hi = float(values.min()), float(np.percentile(values, 99))
    bins = list(np.linspace(lo, hi, 50))
    for label, samples, color in series:
        arr = np.asarray(samples)
        ax.hist(
            arr[arr <= hi],
            bins=bins,
            density=True,
            alpha=0.55,
            color=color,
            label=f"{label}: median {np.median(arr):.4g} ms, n={arr.size}",
        )
        ax.axvline(float(np.median(arr)), color=color, lw=1.5)
    source = (
        "confirmation rounds (fresh processes, interleaved)"
        if data.samples_kind == "confirm"
        else "the study's timing runs"
    )
    title = "Latency distribution" + (
        ": the default route is the best feasible" if same else f": default vs {data.contender_role}"
    )
    ax.set(
        title=title,
        xlabel=f"latency (ms); {int((values > hi).sum())} samples above the 99th percentile not shown",
        ylabel="density",
    )
    conf = data.confirmation or {}
    if conf.get("ci") and not same:
        ax.text(
            0.99,
            0.55,
            f"speedup {conf['speedup']:.3f}x\n{conf['confidence']:.0%} CI {conf['ci'][0]:.3f}x-{conf['ci'][1]:.3f}x",
            ha="right",
            transform=ax.transAxes,
            fontsize=9,
            bbox={"fc": "white", "ec": "#999999"},
        )
    ax.legend(fontsize=8, title=f"samples from {source}", title_fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def accuracy_vs_latency(data: ReportData) -> Figure:
    """Accuracy metric against latency with the tolerance line: the feasible region is left of it."""
    fig, ax = _figure()
    pts = [t for t in _timed(data) if t.accuracy is not None]
    stopped = [t for t in _stopped(data) if t.accuracy is not None]  # the accuracy its gate measured
    gated = [t for t in _untimed(data) if t.accuracy is not None]  # rejected before timing
    if not pts:
        _message(ax, "no timed trial has an accuracy value")
        return fig
    accuracy = {t.number: float(t.accuracy or 0.0) for t in pts + stopped + gated}
    log = min(accuracy.values()) >= 0 and data.tolerance > 0
    floor = min([a for a in accuracy.values() if a > 0] + [data.tolerance]) / 10

    def x_of(t: TrialRow) -> float:
        return (
            (accuracy[t.number] or floor) if log else accuracy[t.number]
        )  # an exact 0 is drawn a decade below the rest

    for chosen, color, marker, label in (
        ([t for t in pts if t.feasible], FEASIBLE, "o", "feasible"),
        ([t for t in pts if not t.feasible], INFEASIBLE, "x", "over tolerance"),
        (stopped, STOPPED, "v", "stopped early while timed: slower than the incumbent"),
    ):
        if chosen:
            ax.scatter(
                [x_of(t) for t in chosen],
                [_latency(t) for t in chosen],
                c=color,
                marker=marker,
                s=30,
                zorder=3,
                label=label,
            )
    if gated:
        ax.plot(
            [x_of(t) for t in gated],
            [0] * len(gated),
            "|",
            color="#ff7f0e",
            ms=14,
            mew=2,
            transform=ax.get_xaxis_transform(),
            clip_on=False,
            label=f"rejected by the accuracy gate, not timed ({len(gated)})",
        )
    names = {data.summary.baseline.number: "default"} if data.summary.baseline else {}
    if data.contender is not None and data.contender not in names:
        names[data.contender] = data.contender_role
    for t in pts:
        if t.number in names:
            below = names[t.number] != "default"  # default above the point, the other below: they often coincide
            ax.annotate(
                f"{names[t.number]} (#{t.number})",
                (x_of(t), _latency(t)),
                textcoords="offset points",
                xytext=(6, -12 if below else 6),
                fontsize=8,
            )
    if log:
        xs = [x_of(t) for t in pts + stopped + gated]
        ax.set_xlim(min(min(xs), data.tolerance) / 10, max(max(xs), data.tolerance) * 10)
        ax.set_xscale("log")
    ax.axvline(data.tolerance, color=INFEASIBLE, ls="--", lw=1.2, label=f"tolerance {data.tolerance:g}")
    ax.set(
        title="Accuracy vs latency",
        xlabel=f"{data.metric} vs the fp32 reference (lower is closer)" + (", log scale" if log else ""),
    )
    _latency_axis(ax, data, [_latency(t) for t in pts + stopped])
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    return fig


def importance(data: ReportData) -> Figure:
    """Parameter importance over the feasible trials (or why there is none)."""
    fig, ax = _figure(8.0, 3.8)
    if not data.importances:
        _message(ax, data.importance_note)
        return fig
    names = list(data.importances)[::-1]
    ax.barh(names, [data.importances[n] for n in names], color=FEASIBLE)
    ax.set(title="Parameter importance (PED-ANOVA over feasible trials)", xlabel="importance (sums to 1)")
    ax.grid(alpha=0.3, axis="x")
    return fig


def failure_classes(data: ReportData) -> Figure:
    """Cumulative count of each outcome over the trials: where the search spends its budget."""
    fig, ax = _figure()
    rows = sorted(data.trials, key=lambda t: t.number)
    if not rows:
        _message(ax, "no finished trial yet")
        return fig
    outcomes = sorted({t.outcome for t in rows}, key=lambda o: (o != "feasible", o != "infeasible", o))
    x = [t.number for t in rows]
    stacks = [np.cumsum([t.outcome == o for t in rows]) for o in outcomes]
    palette = iter(["#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#7f7f7f"])
    colors = [OUTCOME_COLORS.get(o) or next(palette, "#333333") for o in outcomes]
    ax.stackplot(
        x,
        *stacks,
        labels=[f"{o} ({int(s[-1])})" for o, s in zip(outcomes, stacks, strict=True)],
        colors=colors,
        alpha=0.85,
        step="post",
    )
    ax.set(title="Outcomes over time (cumulative)", xlabel="trial number", ylabel="trials")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    return fig


FIGURES: dict[str, Callable[[ReportData], Figure]] = {
    "history": history,
    "latency_distribution": latency_distribution,
    "accuracy_vs_latency": accuracy_vs_latency,
    "importance": importance,
    "failure_classes": failure_classes,
}


def save_all(data: ReportData, out: Path) -> dict[str, Path]:
    """Draw every figure to `out/<name>.png`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, draw in FIGURES.items():
        paths[name] = out / f"{name}.png"
        draw(data).savefig(paths[name])
    return paths
