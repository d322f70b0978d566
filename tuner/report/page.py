"""The report as one self-contained HTML page (figures embedded as base64 PNG)."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from html import escape
from pathlib import Path

from tuner.report.data import ReportData, TrialRow
from tuner.space import canonical_route
from tuner.spec.shapes import shape_label
from tuner.study.verdict import FROM_CONFIRMATION, FROM_RACING, Estimate

CAPTIONS = {
    "history": "Every timed trial's latency; red crosses broke the accuracy tolerance, ticks at the bottom are trials "
    "that failed or were rejected by the accuracy gate before timing.",
    "latency_distribution": "Raw latency samples of the default route and the route compared with it (the confirmed "
    "winner, else the best candidate).",
    "accuracy_vs_latency": "Accuracy against latency; only routes left of the tolerance line are candidates.",
    "importance": "Which knobs explain the latency of the feasible routes.",
    "failure_classes": "How the budget was spent: outcomes accumulated over the trials.",
}
STYLE = """body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:1em 0}\
td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;font-size:14px;white-space:nowrap}
td.route{white-space:normal}
th{background:#f3f3f3}.verdict{padding:.8em 1em;border-left:5px solid #2ca02c;background:#f4fbf4}
.verdict.none{border-color:#999;background:#f6f6f6}figure{margin:1.5em 0}img{max-width:100%}\
figcaption{color:#555;font-size:14px}
code{background:#f3f3f3;padding:1px 4px}"""


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g} ms"


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} MiB"


def _rows(pairs: list[tuple[str, str]]) -> str:
    return "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in pairs)


def _estimate(est: Estimate | None) -> str:
    return "-" if est is None else est.text()


def _headline(data: ReportData) -> str:
    s, head = data.summary, data.headline
    about = f" for trial {head.trial.number}" if head and head.trial else ""
    pairs = [
        ("verdict", head.verdict if head else "-"),
        ("speedup" + about, _estimate(head.estimate if head else None)),
        ("the study's own estimate" + about, _estimate(head.study if head else None)),
        ("trials finished", f"{s.complete + s.pruned + s.failed} of budget {s.budget}"),
        ("feasible / infeasible / failed", f"{s.feasible} / {s.infeasible} / {s.failed}"),
        ("best feasible in the study", f"trial {s.best.number}: {_ms(s.best_ms)}" if s.best else "none"),
        ("default route", f"trial {s.baseline.number}: {_ms(s.default_ms)}" if s.baseline else "not run"),
        (
            "objective",
            f"{data.statistic} latency; accuracy {data.metric} <= {data.tolerance:g}"
            + (f"; peak memory <= {data.max_memory_mb:g} MiB" if data.max_memory_mb is not None else ""),
        ),
    ]
    return f"<table>{_rows(pairs)}</table>"


def _verdict(data: ReportData) -> str:
    head, conf = data.headline, data.confirmation or {}
    cls = "verdict" if head and head.verdict == "speedup" else "verdict none"
    lead = f'<p class="{cls}"><b>{escape(head.sentence if head else "No verdict.")}</b>'
    if not conf:
        return (
            lead
            + "<br>Not confirmed: <code>tuner run</code> re-measures the top candidates against the default when the "
            "budget is spent.</p>"
        )
    detail = (
        f"<br><small>{escape(str(conf.get('method', '')))}; {escape(str(conf.get('created_at', '')))}</small>"
        if conf.get("method")
        else ""
    )
    return f"{lead}<br>Confirmation: {escape(str(conf.get('message', conf.get('verdict'))))}{detail}</p>"


def _confirmed(data: ReportData) -> str:
    """The confirmation's candidates: each one's paired speedup over the default with its interval."""
    conf = data.confirmation or {}
    rows = conf.get("candidates") or []
    if not rows:
        return "<p>No confirmation rounds yet.</p>"
    head = "<tr><th>trial</th><th>confirmed speedup</th><th>interval</th><th>median</th><th>study value</th></tr>"
    body = "".join(
        f"<tr><td>{escape(str(r.get('trial')))}</td>"
        + (
            f'<td colspan="4">{escape(str(r["failure"]))}</td>'
            if r.get("failure")
            else f"<td>{r['speedup']:.3f}x</td><td>{r.get('confidence', 0):.1%} CI "
            f"{r['low']:.3f}x-{r['high']:.3f}x</td><td>{_ms(r.get('median_ms'))}</td><td>{_ms(r.get('study_value'))}</td>"
        )
        + "</tr>"
        for r in rows
    )
    return (
        f"<table>{head}{body}</table><p><small>Default route median {escape(_ms(conf.get('default_median_ms')))} over "
        f"{escape(str(conf.get('rounds')))} interleaved rounds.</small></p>"
    )


def _shapes(data: ReportData) -> str:
    """Each input shape's speedup of the route the verdict is about (`Headline.shapes`), when there are several."""
    head = data.headline
    if head is None or head.trial is None or len(head.shapes) < 2:
        return ""
    source = {FROM_CONFIRMATION: "the confirmation", FROM_RACING: "racing's re-measurements, pooled"}.get(
        head.shapes_from, "its own timing in the study"
    )
    rows = "".join(
        f"<tr><td>{escape(shape_label(s['inputs']))}</td><td>{s['weight']:g}</td><td>{_ms(s.get('default_ms'))}</td>"
        f"<td>{_ms(s.get('route_ms'))}</td>"
        + (
            f"<td>{s['speedup']:.3f}x</td><td>{s['ci'][0]:.3f}x-{s['ci'][1]:.3f}x</td>"
            if s.get("speedup") is not None and s.get("ci")
            else '<td colspan="2">not timed paired</td>'
        )
        + "</tr>"
        for s in head.shapes
    )
    return (
        f"<h2>Per input shape: trial {head.trial.number}</h2><table><tr><th>input shape</th><th>weight</th>"
        f"<th>default route</th><th>this route</th><th>speedup</th><th>interval</th></tr>{rows}</table>"
        f"<p><small>From {source}; the speedup above is the weighted geometric mean over the shapes.</small></p>"
    )


def _top_trials(data: ReportData, limit: int = 10) -> str:
    """The fastest feasible routes, each once (repeats of a route are listed in its row)."""
    routes: dict[str, list[TrialRow]] = {}
    for t in sorted((t for t in data.trials if t.feasible), key=lambda t: (t.value, t.number)):
        routes.setdefault(canonical_route(t.params), []).append(t)
    if not routes:
        return "<p>No feasible trial.</p>"
    head = (
        "<tr><th>trial</th><th>latency</th><th>speedup vs default in the study</th><th>accuracy</th><th>engine "
        "file</th><th>peak memory</th><th>route</th><th>same route in</th></tr>"
    )
    body = "".join(
        f"<tr><td>{t.number}</td><td>{_ms(t.latency_ms)}</td><td>{escape(_estimate(t.speedup))}</td>"
        f"<td>{'-' if t.accuracy is None else f'{t.accuracy:.3g}'}</td>"
        f"<td>{_mib(None if t.artifact_bytes is None else t.artifact_bytes / (1 << 20))}</td>"
        f"<td>{_mib(t.peak_memory_mb)}</td>"
        f'<td class="route"><code>{escape(", ".join(f"{k}={v}" for k, v in t.params.items()))}</code></td>'
        f'<td class="route">{", ".join(str(r.number) for r in rest) or "-"}</td></tr>'
        for t, *rest in list(routes.values())[:limit]
    )
    return f"<table>{head}{body}</table>"


def _failures(data: ReportData) -> str:
    classes = data.summary.failure_classes
    if not classes:
        return "<p>No trial failed.</p>"
    rows = "".join(f"<tr><td>{escape(k)}</td><td>{v}</td></tr>" for k, v in sorted(classes.items()))
    return f"<table><tr><th>failure class</th><th>trials</th></tr>{rows}</table>"


def render(data: ReportData, figures: dict[str, Path]) -> str:
    """The whole page."""
    images = "".join(
        f'<figure><img alt="{escape(name)}" src="data:image/png;base64,{base64.b64encode(path.read_bytes()).decode()}">'
        f"<figcaption>{escape(CAPTIONS.get(name, ''))}</figcaption></figure>"
        for name, path in figures.items()
    )
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Route Tuner report: '
        f"{escape(data.study)}</title>"
        f"<style>{STYLE}</style></head><body><h1>Route Tuner report: {escape(data.study)}</h1>"
        f"{_verdict(data)}<h2>Summary</h2>{_headline(data)}<h2>Confirmation: paired speedups</h2>{_confirmed(data)}"
        f"{_shapes(data)}"
        f"<h2>Fastest feasible routes</h2>{_top_trials(data)}"
        f"<h2>Failures</h2>{_failures(data)}<h2>Figures</h2>{images}"
        f"<p><small>Generated {stamp} by route-tuner. Export the winner with <code>tuner best SPEC --export "
        "DIR</code>.</small></p></body></html>"
    )
