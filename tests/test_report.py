"""`tuner report`: a self-contained HTML page and PNG figures drawn from a real study."""

from __future__ import annotations

import base64
import re
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from matplotlib.image import imread

from tests.conftest import SpecWriter, run_study
from tuner.report import page, plots
from tuner.report.data import ReportData, TrialRow, collect, importances
from tuner.spec import load_spec
from tuner.store.cache import ResultStore
from tuner.store.urls import normalize_url
from tuner.study import verdict as V
from tuner.study.setup import Context
from tuner.study.summary import Summary
from tuner.study.verdict import Headline, decide

FIGURES = {"history", "latency_distribution", "accuracy_vs_latency", "importance", "failure_classes"}
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_report_from_a_real_study(cli, write_spec: SpecWriter, pg_url: str, tmp_path: Path) -> None:
    spec = write_spec(
        **{
            "accuracy.tolerance": 1e-9,
            "run.budget": 6,
            "run.startup_trials": 6,
            "run.racing": False,  # no `slow` pruning: the enqueued route stays feasible
            "backend.space": {"precision": ["fp32", "fp16", "int8_dynamic"], "intra_op_threads": [0, 1]},
        }
    )
    run_study(spec, pg_url, 1)  # the default route only
    study = optuna.load_study(study_name="tiny", storage=normalize_url(pg_url))
    study.enqueue_trial(
        {**study.trials[0].params, "intra_op_threads": 1}
    )  # a feasible fp32 route besides the default, for sure
    study.enqueue_trial(
        {**study.trials[0].params, "precision": "fp16"}
    )  # and one that breaks a 1e-9 tolerance, for sure
    run_study(spec, pg_url, confirm=True, confirm_top_k=1, confirm_rounds=6)
    out = tmp_path / "report"
    rep = cli("report", str(spec), "--storage", pg_url, "--out", str(out))
    assert rep.returncode == 0, rep.stderr
    assert "5 figures" in rep.stdout

    html = (out / "report.html").read_text()
    assert not re.search(r"""(src|href)=["']?(https?:|//|file:)""", html)  # self-contained: nothing to fetch
    embedded = re.findall(r'<img alt="([a-z_]+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert {name for name, _ in embedded} == FIGURES
    for name, b64 in embedded:
        png = out / f"{name}.png"
        assert base64.b64decode(b64) == png.read_bytes() and png.read_bytes().startswith(PNG)
        height, width = imread(png).shape[:2]
        assert width >= 600 and height >= 300

    url = normalize_url(pg_url)
    study = optuna.load_study(study_name="tiny", storage=url)
    conf = study.user_attrs["confirmation"]
    assert conf["message"] in html.replace("&#x27;", "'")
    data = collect(Context(load_spec(spec), url), study)
    assert data.summary.best is not None and f"trial {data.summary.best.number}:" in html
    assert conf["trial"] is not None  # a candidate was re-measured: the distribution shows the confirmation samples
    assert data.samples_kind == "confirm" and data.contender == conf["trial"]
    runs = ResultStore(url).measurements("tiny", kind="confirm")
    assert len(data.samples["default"]) == sum(
        len(m.samples_ms) for m in runs if m.trial_number == conf["baseline_trial"]
    )
    assert {t.number for t in data.trials} == {t.number for t in study.trials}
    assert [t.feasible for t in data.trials if study.trials[t.number].params["precision"] == "fp16"][:1] == [False]
    default = next(
        t for t in data.trials if t.number == 0
    )  # feasible, so in the table with its engine size and peak memory
    assert (
        default.peak_memory_mb is not None
        and default.artifact_bytes
        and f"<td>{default.peak_memory_mb:.1f} MiB</td>" in html
    )
    for t in data.trials:  # the latencies shown are measured ones, never the baseline's figure scaled by a ratio
        assert t.latency_ms == study.trials[t.number].user_attrs.get("measured_ms", {}).get("trial")
    assert f"<td>{default.number}</td><td>{default.latency_ms:.4g} ms</td>" in html


def test_importance_needs_enough_feasible_trials() -> None:
    scores, note = importances([])
    assert scores == {} and "not enough data" in note
    dist = {"k": optuna.distributions.CategoricalDistribution(["a", "b"])}
    trials = [
        optuna.trial.create_trial(
            params={"k": "a" if i % 2 else "b"},
            distributions=dist,
            value=1.0 + (i % 2),
            constraints={"accuracy": -1.0, "failure": -1.0},
        )
        for i in range(6)
    ]
    scores, note = importances(trials)
    assert note == "" and set(scores) == {"k"}
    scores, note = importances(trials[:3])
    assert scores == {} and "3 feasible trial(s)" in note


def _empty(study: str) -> Summary:
    """The summary of a study with no trial."""
    return Summary(
        study=study,
        budget=4,
        complete=0,
        pruned=0,
        failed=0,
        running=0,
        waiting=0,
        feasible=0,
        infeasible=0,
        requeued=0,
        cache_hits=0,
        best=None,
        baseline=None,
        elapsed_s=0.0,
        failure_classes={},
    )


def test_every_figure_copes_with_an_empty_study(tmp_path: Path) -> None:
    summary = _empty("empty")
    data = ReportData(
        study="empty",
        statistic="median",
        metric="cosine",
        tolerance=1e-3,
        summary=summary,
        trials=[],
        confirmation=None,
        importance_note="not enough data for parameter importance: 0 feasible trial(s)",
    )
    paths = plots.save_all(data, tmp_path)
    assert set(paths) == FIGURES and all(p.read_bytes().startswith(PNG) for p in paths.values())


def test_the_history_draws_measured_latencies_and_trials_stopped_early_where_they_were_measured() -> None:
    def row(number: int, value: float | None, latency: float | None, outcome: str) -> TrialRow:
        state = "COMPLETE" if value is not None else "PRUNED"
        return TrialRow(number, state, value, outcome == "feasible", outcome, None, {}, "", latency_ms=latency)

    trials = [
        replace(row(0, 5.7, 5.7, "feasible"), accuracy=0.0),
        replace(row(1, None, 9.4, "slow"), accuracy=0.0),  # timed until it was clearly slower: no value
        replace(row(2, None, None, "accuracy-gate"), accuracy=0.5),  # never timed
        replace(row(3, 5.8, 4.2, "feasible"), accuracy=0.0),  # value: trial 0's 5.7 scaled by its ratio; measured 4.2
    ]
    summary = replace(_empty("h"), default_ms=4.4)
    data = ReportData("h", "median", "cosine", 1e-3, summary, trials, confirmation=None)
    ax = plots.history(data).axes[0]
    drawn = {c.get_label(): [tuple(xy) for xy in c.get_offsets()] for c in ax.collections}
    assert drawn["feasible"] == [(0, 5.7), (3, 4.2)]
    assert drawn["stopped early while timed: slower than the incumbent"] == [(1, 9.4)]
    labels = [line.get_label() for line in ax.lines]
    assert "not timed: failed or gate-rejected (1)" in labels and "default route (median as measured, 4.4 ms)" in labels
    ax = plots.accuracy_vs_latency(data).axes[0]
    drawn = {c.get_label(): [xy[1] for xy in c.get_offsets()] for c in ax.collections}
    assert drawn["feasible"] == [5.7, 4.2] and drawn["stopped early while timed: slower than the incumbent"] == [9.4]
    assert "rejected by the accuracy gate, not timed (1)" in [line.get_label() for line in ax.lines]


def test_the_page_escapes_every_stored_string_and_leads_with_the_verdict() -> None:
    """Confirmation fields come from the database (a study attribute anyone with access can set): all are escaped."""
    summary = _empty("s")
    evil = "<script>alert(1)</script>"
    conf = {
        "verdict": "speedup",
        "message": evil,
        "method": evil,
        "created_at": evil,
        "rounds": evil,
        "candidates": [{"trial": evil, "failure": evil}],
    }
    head = decide(summary, conf, [])
    data = ReportData(
        study="s",
        statistic="median",
        metric="cosine",
        tolerance=1e-3,
        summary=summary,
        trials=[],
        confirmation=conf,
        headline=head,
    )
    html = page.render(data, {})
    assert (
        "<script" not in html and html.count("&lt;script&gt;") == 6
    )  # message, method, created_at, rounds, trial, failure
    assert html.index(head.sentence) < html.index("<h2>Summary</h2>")


def test_the_page_has_a_table_of_each_shape_of_the_route_the_verdict_is_about() -> None:
    trial = optuna.trial.create_trial(value=1.0)
    trial.number = 3
    shapes = tuple(
        {
            "inputs": {"<b>x": [n, 3, 16, 16]},
            "weight": w,
            "default_ms": 2.0,
            "route_ms": 2.0 / s,
            "speedup": s,
            "ci": ci,
        }
        for n, w, s, ci in ((1, 0.7, 1.25, [1.2, 1.3]), (8, 0.3, 0.95, [0.9, 0.99]))
    )
    est = V.Estimate(1.1, 1.05, 1.15, True)
    head = Headline(V.SPEEDUP, "Use trial 3.", trial, est, None, 3, 0, shapes, V.FROM_CONFIRMATION)
    data = ReportData("s", "median", "cosine", 1e-3, _empty("s"), [], None, headline=head)
    html = page.render(data, {})
    table = html[html.index("<h2>Per input shape: trial 3</h2>") : html.index("<h2>Fastest feasible routes</h2>")]
    assert "<td>&lt;b&gt;x 8x3x16x16</td><td>0.3</td><td>2 ms</td><td>2.105 ms</td><td>0.950x</td>" in table
    assert "1.200x-1.300x" in table and "From the confirmation" in table
    raced = replace(head, verdict=V.UNCONFIRMED, shapes_from=V.FROM_RACING)  # racing's pooled figures, said so
    assert "From racing's re-measurements, pooled; " in page.render(
        ReportData("s", "median", "cosine", 1e-3, _empty("s"), [], None, headline=raced), {}
    )
    one = page.render(
        ReportData("s", "median", "cosine", 1e-3, _empty("s"), [], None, headline=replace(head, shapes=shapes[:1])), {}
    )
    assert "Per input shape" not in one  # one shape: the speedup above is that shape's
