"""Search efficiency, measured: builds until the best feasible engine, per strategy, on recorded landscapes.

    python bench/search_efficiency.py            # all scenarios, 20 seeds, 100 builds
    python bench/search_efficiency.py --jobs 8   # the same, in 8 processes

Every strategy (bench/landscape/strategies.py) runs `--seeds` times on each scenario (a landscape
under one accuracy tolerance) until it has spent `--budget` builds. Writes
bench/results/search-efficiency.json (every run's scores), the result tables into
docs/search-efficiency.md (between the results markers) and docs/img/search-efficiency.png.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from multiprocessing import Pool
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.landscape.oracle import Oracle  # noqa: E402
from bench.landscape.score import BUDGETS, LEVELS, score, summarise  # noqa: E402
from bench.landscape.strategies import STRATEGIES, TRIAL_CAP  # noqa: E402
from tuner.backends.replay.landscape import load_landscape  # noqa: E402

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


@dataclass(frozen=True)
class Scenario:
    """A landscape under one accuracy metric and tolerance (None: those of the study it was recorded from)."""

    name: str
    landscape: str
    tolerance: float | None = None
    metric: str | None = None
    note: str = ""


SCENARIOS = (
    Scenario("efficientnet", "bench/landscapes/efficientnet_lite0.json.gz", note="the study's tolerance: at most 2 of 16 crops change class"),
    Scenario("efficientnet-strict", "bench/landscapes/efficientnet_lite0.json.gz", 0.001, "cosine", "logits within cosine distance 0.001"),
    Scenario("minilm", "bench/landscapes/minilm_l6.json.gz", note="the study's tolerance: embedding cosine distance <= 0.02"),
    Scenario("minilm-strict", "bench/landscapes/minilm_l6.json.gz", 0.001, note="embedding cosine distance <= 0.001"),
)


@cache
def oracle_for(scenario: Scenario) -> Oracle:
    """The scenario's oracle (loaded once per process)."""
    landscape = load_landscape(REPO / scenario.landscape)
    tol = scenario.tolerance if scenario.tolerance is not None else float(landscape.meta["accuracy"]["tolerance"])
    return Oracle(landscape, tol, metric=scenario.metric or "", statistic=landscape.meta["objective"]["statistic"])


def one_run(task: tuple[Scenario, str, int, int]) -> tuple[str, str, int, dict[str, Any]]:
    """Run one strategy once and score it (picklable, for the process pool)."""
    scenario, name, seed, budget = task
    oracle = oracle_for(scenario)
    t0 = time.perf_counter()
    steps = STRATEGIES[name].trace(oracle, budget, seed)
    result = score(steps, oracle, budget)
    result["seconds"] = round(time.perf_counter() - t0, 3)
    return scenario.name, name, seed, result


def run_all(scenarios: Sequence[Scenario], names: Sequence[str], seeds: int, budget: int, jobs: int) -> dict[str, Any]:
    """Every (scenario, strategy, seed) run, grouped and summarised."""
    tasks = [(sc, name, seed, budget) for sc in scenarios for name in names for seed in range(seeds)]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {sc.name: {n: [] for n in names} for sc in scenarios}
    t0 = time.monotonic()
    if jobs > 1:
        with Pool(jobs) as pool:
            results = pool.imap_unordered(one_run, tasks, chunksize=1)
            for i, (sc, name, seed, r) in enumerate(results, 1):
                runs[sc][name].append({"seed": seed, **r})
                _progress(i, len(tasks), t0)
    else:
        for i, task in enumerate(tasks, 1):
            sc, name, seed, r = one_run(task)
            runs[sc][name].append({"seed": seed, **r})
            _progress(i, len(tasks), t0)
    return {sc: {n: _summary(sorted(rs, key=lambda r: r["seed"]), budget) for n, rs in by.items()} for sc, by in runs.items()}


def _progress(i: int, n: int, t0: float) -> None:
    if i % 25 == 0 or i == n:
        rate = (time.monotonic() - t0) / i
        print(f"{i}/{n} runs, eta {rate * (n - i) / 60:.1f} min", file=sys.stderr, flush=True)


def _summary(runs: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    keys = ([f"builds_to_{round(lv * 100)}pct" for lv in LEVELS] + [f"regret_at_{b}" for b in BUDGETS if b <= budget]
            + ["chosen_regret_at_end", "wasted_fraction", "builds", "trials"])
    out: dict[str, Any] = {k: summarise([r.get(k) for r in runs]) for k in keys}
    length = max(len(r["curve"]) for r in runs)
    padded = [r["curve"] + [r["curve"][-1] if r["curve"] else None] * (length - len(r["curve"])) for r in runs]
    out["median_curve"] = [summarise(col)["median"] for col in zip(*padded)] if runs else []
    out["runs"] = [{k: v for k, v in r.items() if k != "curve"} for r in runs]
    return out


# -- report ---------------------------------------------------------------------------------------


def _cell(s: dict[str, Any], fmt: str, budget: int) -> str:
    def f(v: float | None) -> str:
        if v is None:
            return f">{budget}" if fmt == "builds" else "-"
        return f"{100 * v:.1f}%" if fmt == "pct" else f"{v:.0f}"
    return f"{f(s['median'])} [{f(s['q25'])}–{f(s['q75'])}]"


def markdown(doc: dict[str, Any]) -> str:
    """The result tables (median [IQR] over seeds) for docs/search-efficiency.md."""
    budget = doc["settings"]["budget"]
    lines = [f"Generated by `python bench/search_efficiency.py` on {doc['generated']}: {doc['settings']['seeds']} seeds per cell, "
             f"budget {budget} builds, median [25th–75th percentile] over seeds. `>{budget}`: not reached within the budget.", ""]
    lines += ["| Scenario | tolerance | routes | failing | feasible | within 2 % | within 5 % | default | true best | fastest (any accuracy) | round-to-round spread |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, sc in doc["scenarios"].items():
        d = sc["facts"]
        lines.append(f"| {name} | {sc['metric']} ≤ {sc['tolerance']:g} | {d['routes']} | {d['failing']} | {d['feasible']} | {d['within_2pct']} | {d['within_5pct']} | "
                     f"{_ms(d['default_ms'])} | {_ms(d['best_ms'])} | {_ms(d['fastest_any_ms'])} | {d['round_spread']:.2f}× |")
    for metric, title, fmt in (("builds_to_2pct", "Builds until a route within 2 % of the true best feasible has been built", "builds"),
                               ("builds_to_5pct", "Builds until within 5 %", "builds"),
                               *((f"regret_at_{b}", f"Regret after {b} builds (best route built: true latency / true best − 1)", "pct") for b in BUDGETS if b <= budget),
                               ("chosen_regret_at_end", "Regret of the route chosen by its single measurement, at the end of the run (no confirmation)", "pct"),
                               ("wasted_fraction", "Share of builds spent on infeasible or failing routes", "pct"),
                               ("builds", "Builds made (a strategy may stop early or run out of trials)", "count"),
                               ("trials", f"Trials used (cache hits included; runs stop at {doc['settings']['trial_cap']} trials)", "count")):
        names = list(doc["scenarios"])
        lines += ["", f"**{title}**", "", "| Strategy | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for strat, label in doc["strategies"].items():
            cells = [_cell(doc["results"][sc][strat][metric], fmt, budget) for sc in names]
            lines.append(f"| `{strat}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} ms"


def write_docs(doc: dict[str, Any], md_path: Path) -> None:
    """Replace the text between the results markers of `md_path` (or create it)."""
    block = f"{BEGIN}\n{markdown(doc)}\n{END}"
    text = md_path.read_text() if md_path.exists() else f"# Search efficiency\n\n{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(head + block + tail)


def plot(doc: dict[str, Any], path: Path) -> None:
    """Median best-so-far curves (best route built: true latency / true best) per scenario."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(doc["scenarios"])
    cols = min(2, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False)
    styles = {"ours": dict(color="black", lw=2.5), "random": dict(color="tab:gray", ls="--", lw=2),
              "gpt-fast": dict(color="tab:red", lw=2), "gpt-mixed": dict(color="tab:orange", lw=2),
              "olive-tpe": dict(color="tab:purple", lw=2)}
    for ax, name in zip(axes.flat, names):
        for strat in doc["strategies"]:
            curve = doc["results"][name][strat]["median_curve"]
            y = [c if c is not None else float("nan") for c in curve]
            ax.plot(range(1, len(y) + 1), y, label=strat, **styles.get(strat, dict(lw=1, alpha=0.8)))
        ax.axhline(1.02, color="green", lw=0.8, ls=":")
        ax.set_yscale("log")
        ax.set_ylim(0.99, 3.0)
        ax.set_yticks([1, 1.1, 1.2, 1.5, 2, 3], ["1", "1.1", "1.2", "1.5", "2", "3"])
        ax.minorticks_off()
        ax.set_title(f"{name} ({doc['scenarios'][name]['metric']} ≤ {doc['scenarios'][name]['tolerance']:g})")
        ax.set_xlabel("builds")
        ax.set_ylabel("best built / true best feasible (median)")
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(prog="python bench/search_efficiency.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--budget", type=int, default=100)
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--strategies", nargs="*", default=list(STRATEGIES), choices=list(STRATEGIES))
    p.add_argument("--scenarios", nargs="*", default=[s.name for s in SCENARIOS], choices=[s.name for s in SCENARIOS])
    p.add_argument("--json", type=Path, default=REPO / "bench/results/search-efficiency.json")
    p.add_argument("--markdown", type=Path, default=REPO / "docs/search-efficiency.md")
    p.add_argument("--png", type=Path, default=REPO / "docs/img/search-efficiency.png")
    p.add_argument("--report-only", action="store_true", help="re-render the markdown and PNG from the JSON")
    args = p.parse_args(argv)
    if args.report_only:
        doc = json.loads(args.json.read_text())
        write_docs(doc, args.markdown)
        plot(doc, args.png)
        return 0
    scenarios = [s for s in SCENARIOS if s.name in args.scenarios]
    import optuna

    doc: dict[str, Any] = {
        "generated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "settings": {"seeds": args.seeds, "budget": args.budget, "trial_cap": TRIAL_CAP * args.budget, "levels": list(LEVELS), "budgets": list(BUDGETS)},
        "environment": {"python": platform.python_version(), "optuna": optuna.__version__, "machine": platform.machine()},
        "strategies": {n: STRATEGIES[n].label for n in args.strategies},
        "scenarios": {},
    }
    for sc in scenarios:
        o = oracle_for(sc)
        meta = o.landscape.meta
        doc["scenarios"][sc.name] = {
            "landscape": sc.landscape, "note": sc.note, "metric": o.metric, "tolerance": o.tolerance, "facts": o.describe(),
            "recorded": {"backend": meta["backend"], "environment": meta["environment"], "enumeration": meta["enumeration"]},
        }
    doc["results"] = run_all(scenarios, args.strategies, args.seeds, args.budget, args.jobs)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1, default=str))
    write_docs(doc, args.markdown)
    plot(doc, args.png)
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
