"""Search efficiency, measured as a user lives it: the route each strategy would deliver, per budget.

    python bench/search_efficiency.py            # all scenarios, 20 seeds, 100 builds
    python bench/search_efficiency.py --jobs 2   # the same, in 2 processes
    python bench/search_efficiency.py --report-only   # re-render docs and PNG from the JSON
    python bench/search_efficiency.py --stop-after 540 [--resume]   # in pieces: each call goes on where one stopped

Every strategy (bench/landscape/strategies.py) runs `--seeds` times on each scenario (a landscape
under one accuracy tolerance) until it has spent `--budget` builds. Each run is scored by the true
value of the route it would deliver after each build, by its own selection rule (bench/landscape/
score.py), and, secondarily, by the best route it built. The default sampler is chosen from the
tuning scenarios only, by the rule in `choose_default`, and reported on the held-out one. Writes
bench/results/search-efficiency.json (every run's scores), the result tables into
docs/search-efficiency.md (between the results markers) and docs/img/search-efficiency.png. With
`--stop-after` it stops starting runs after that many seconds and writes the cells (a strategy on a
scenario, every seed) and transfer rows it completed, with the rest under `missing`; `--resume` keeps
what such a file holds for the same settings and landscapes and runs only the rest (of the file's own
strategies unless `--strategies` names others).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from multiprocessing import Pool
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.landscape.score import LEVELS, score, share, summarise  # noqa: E402
from bench.landscape.strategies import CHECKPOINTS as BUDGETS  # noqa: E402
from bench.landscape.strategies import DEFAULT_SET, STRATEGIES, TRIAL_CAP  # noqa: E402
from bench.landscape.truth import Truth  # noqa: E402
from tuner.backends.replay.landscape import load_landscape  # noqa: E402
from tuner.files import atomic_write  # noqa: E402
from tuner.spec import RunSpec  # noqa: E402
from tuner.study import attrs as A  # noqa: E402

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


@dataclass(frozen=True)
class Scenario:
    """A landscape under one accuracy metric and tolerance (None: those of the study it was recorded from).

    `model` names the model (scenarios of one model share its landscape: transfer never draws on the
    same model); `drift_share` is the replay's (`tuner.backends.replay.run`): 1 for landscapes recorded
    paired with the default route, `UNPAIRED_DRIFT_SHARE` for those recorded un-paired.
    """

    name: str
    landscape: str
    model: str
    tolerance: float | None = None
    metric: str | None = None
    note: str = ""
    held_out: bool = False  # never used to choose defaults; reported separately


UNPAIRED_DRIFT_SHARE = 0.1  # the share of an un-paired recording's between-round drift assumed to survive pairing
SCENARIOS = (
    Scenario(
        "efficientnet",
        "bench/landscapes/efficientnet_lite0.json.gz",
        "efficientnet-lite0",
        note="the study's tolerance: at most 2 of 16 crops change class",
    ),
    Scenario(
        "efficientnet-strict",
        "bench/landscapes/efficientnet_lite0.json.gz",
        "efficientnet-lite0",
        0.001,
        "cosine",
        "logits within cosine distance 0.001",
    ),
    Scenario(
        "minilm",
        "bench/landscapes/minilm_l6.json.gz",
        "minilm-l6",
        note="the study's tolerance: embedding cosine distance <= 0.02",
    ),
    Scenario(
        "minilm-strict",
        "bench/landscapes/minilm_l6.json.gz",
        "minilm-l6",
        0.001,
        note="embedding cosine distance <= 0.001",
    ),
    Scenario(
        "inductor-h200",
        "bench/landscapes/efficientnet_lite0_inductor_h200.json.gz",
        "efficientnet-lite0-inductor",
        0.125,
        "top1_mismatch",
        "H200, PyTorch Inductor, 64 routes; the GPU study's tolerance: at most 2 of 16 photos change class",
        held_out=True,
    ),
    Scenario("silero-vad", "bench/landscapes/silero_vad.json.gz", "silero-vad", note="the study's tolerance"),
    Scenario(
        "silero-vad-strict",
        "bench/landscapes/silero_vad.json.gz",
        "silero-vad",
        0.0001,
        "max_abs",
        "speech probability within 1e-4",
    ),
    Scenario(
        "ppocr-rec", "bench/landscapes/ppocrv4_rec.json.gz", "ppocrv4-rec", note="the study's tolerance", held_out=True
    ),
    Scenario(
        "ppocr-rec-strict",
        "bench/landscapes/ppocrv4_rec.json.gz",
        "ppocrv4-rec",
        0.001,
        "cosine",
        "logits within cosine distance 0.001",
        held_out=True,
    ),
)


def available(scenarios: Sequence[Scenario]) -> list[Scenario]:
    """The scenarios whose landscape file exists (new models' landscapes are recorded on a quiet machine)."""
    return [s for s in scenarios if (REPO / s.landscape).exists()]


@cache
def truth_for(scenario: Scenario) -> Truth:
    """The scenario's truth (loaded once per process)."""
    landscape = load_landscape(REPO / scenario.landscape)
    tol = scenario.tolerance if scenario.tolerance is not None else float(landscape.meta["accuracy"]["tolerance"])
    return Truth(landscape, tol, metric=scenario.metric or "", statistic=landscape.meta["objective"]["statistic"])


def unmade_sampler(names: Sequence[str], scenarios: Sequence[Scenario]) -> str:
    """Empty when every named study strategy's sampler can be made here, else one line naming the first that cannot
    and why (a library it needs is not installed: SMAC3 comes with the `bench` extra), before any run is spent."""
    if not scenarios:
        return ""
    space = truth_for(scenarios[0]).space
    for name in names:
        factory = STRATEGIES[name].sampler
        try:
            if factory is not None:
                factory(space, 0)
        except ImportError as exc:
            return f"{name}: {exc} (pip install '.[bench]')"
    return ""


def drift_share(scenario: Scenario) -> float:
    """How much recorded between-round drift the scenario's replay carries."""
    landscape = truth_for(scenario).landscape
    return 1.0 if landscape.paired() or len(landscape.points[0].rounds) <= 1 else UNPAIRED_DRIFT_SHARE


def one_run(task: tuple[Scenario, str, int, int]) -> tuple[str, str, int, dict[str, Any]]:
    """Run one strategy once and score it (picklable, for the process pool)."""
    scenario, name, seed, budget = task
    truth = truth_for(scenario)
    t0 = time.perf_counter()
    try:
        run = STRATEGIES[name].run(truth, budget, seed, drift_share(scenario))
    except StopIteration as exc:  # would end the pool's result iteration silently
        raise RuntimeError(f"{scenario.name}/{name}/seed {seed}: StopIteration") from exc
    result = score(run, truth, budget)
    result["seconds"] = round(time.perf_counter() - t0, 3)
    return scenario.name, name, seed, result


def run_all(
    scenarios: Sequence[Scenario],
    names: Sequence[str],
    seeds: int,
    budget: int,
    jobs: int,
    done: dict[str, Any] | None = None,
    deadline: float = math.inf,
) -> dict[str, Any]:
    """Every (scenario, strategy, seed) run, grouped and summarised; the cells of `done` (an earlier run's results
    with the same settings) are kept, not run again. At `deadline` (time.monotonic) the runs stop and only the cells
    with every seed are returned."""
    done = done or {}
    todo = [(sc, n) for n in names for sc in scenarios if n not in done.get(sc.name, {})]  # a strategy's cells first
    tasks = [(sc, name, seed, budget) for sc, name in todo for seed in range(seeds)]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {sc.name: {} for sc in scenarios}
    t0 = time.monotonic()
    for i, (sc, name, seed, r) in enumerate(_pooled(one_run, tasks, jobs, deadline), 1):
        runs[sc].setdefault(name, []).append({"seed": seed, **r})
        _progress(i, len(tasks), t0)
    return {
        sc.name: {
            n: done[sc.name][n]
            if n in done.get(sc.name, {})
            else _summary(sorted(runs[sc.name][n], key=lambda r: r["seed"]), budget)
            for n in names
            if n in done.get(sc.name, {}) or len(runs[sc.name].get(n, [])) == seeds
        }
        for sc in scenarios
    }


def _pooled(fn: Callable[[Any], Any], tasks: list[Any], jobs: int, deadline: float) -> Iterator[Any]:
    """fn over tasks, in `jobs` processes (unordered), until every task is done or `deadline` passes."""
    if time.monotonic() >= deadline or not tasks:
        return
    if jobs <= 1:
        for task in tasks:
            yield fn(task)
            if time.monotonic() >= deadline:
                return
        return
    with Pool(jobs) as pool:  # leaving the block terminates the tasks still running
        for result in pool.imap_unordered(fn, tasks, chunksize=1):
            yield result
            if time.monotonic() >= deadline:
                return


TRANSFER_SOURCE_BUILDS = 30  # each source study's budget in the transfer runs


def transfer_sources(target: Scenario, scenarios: Sequence[Scenario]) -> list[Scenario]:
    """One scenario (its study's tolerance: the first listed) of every *other* model recorded on the same kind of
    device."""
    kind = truth_for(target).landscape.meta["environment"].get("device", {})
    out: dict[str, Scenario] = {}
    for sc in scenarios:
        if (
            sc.model != target.model
            and sc.model not in out
            and truth_for(sc).landscape.meta["environment"].get("device", {}) == kind
        ):
            out[sc.model] = sc
    return list(out.values())


def transfer_run(task: tuple[Scenario, tuple[Scenario, ...], int, int]) -> tuple[str, int, dict[str, Any]]:
    """Leave-one-model-out: the source models' studies (the default sampler, TRANSFER_SOURCE_BUILDS builds each) in one
    storage, then the target's study with `warm_start` on and off; both scored."""
    import tempfile

    import optuna

    from bench.landscape.simulate import Simulation
    from bench.landscape.strategies import CHECKPOINTS, TRIAL_CAP, Run, default_sampler

    target, sources, seed, budget = task
    storage = optuna.storages.InMemoryStorage()
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="search-transfer-") as tmp:
        for sc in sources:
            src = Simulation(
                truth_for(sc),
                default_sampler(truth_for(sc).space, seed),
                Path(tmp) / sc.name,
                drift_share(sc),
                seed,
                storage=storage,
                name=f"{sc.name}-{seed}",
            )
            src.run(TRANSFER_SOURCE_BUILDS, (), TRIAL_CAP * TRANSFER_SOURCE_BUILDS)
        truth = truth_for(target)
        for label, warm in (("warm", True), ("cold", False)):
            sim = Simulation(
                truth,
                default_sampler(truth.space, seed),
                Path(tmp) / label,
                drift_share(target),
                seed,
                storage=storage,
                name=f"{target.name}-{label}-{seed}",
                warm_start=warm,
            )
            sim.run(budget, CHECKPOINTS, TRIAL_CAP * budget)
            run = Run(sim.steps, sim.confirmed, sim.remeasures, sim.seconds, confirm_runs=sim.confirm_runs)
            out[label] = score(run, truth, budget)
            out[label]["sources"] = [
                e["study"] for e in (sim.study.user_attrs.get(A.WARM_START) or {}).get("sources", [])
            ]
    return target.name, seed, out


def run_transfer(
    scenarios: Sequence[Scenario],
    seeds: int,
    budget: int,
    jobs: int,
    done: dict[str, Any] | None = None,
    deadline: float = math.inf,
) -> dict[str, Any]:
    """The transfer rows: per target scenario with a source, builds to 2 % and within 2 % at 30 with and without a warm
    start; the rows of `done` are kept, and at `deadline` only the rows with every seed are returned."""
    done = done or {}
    tasks = [
        (sc, tuple(src), seed, budget)
        for sc in scenarios
        if sc.name not in done and (src := transfer_sources(sc, scenarios))
        for seed in range(seeds)
    ]
    runs: dict[str, list[dict[str, Any]]] = {}
    t0 = time.monotonic()
    for i, (name, seed, r) in enumerate(_pooled(transfer_run, tasks, jobs, deadline), 1):
        runs.setdefault(name, []).append({"seed": seed, **r})
        _progress(i, len(tasks), t0)
    out: dict[str, Any] = {sc.name: done[sc.name] for sc in scenarios if sc.name in done}
    for name, rs in runs.items():
        if len(rs) != seeds:
            continue
        row: dict[str, Any] = {"sources": rs[0]["warm"]["sources"], "seeds": len(rs)}
        for label in ("warm", "cold"):
            row[label] = {
                "delivered_builds_to_2pct": summarise([r[label]["delivered_builds_to_2pct"] for r in rs]),
                "builds_to_2pct": summarise([r[label]["builds_to_2pct"] for r in rs]),
                f"delivered_within_2pct_at_{CHOICE_BUDGET}": share(
                    [r[label].get(f"delivered_within_2pct_at_{CHOICE_BUDGET}", False) for r in rs]
                ),
            }
        w, c = row["warm"]["delivered_builds_to_2pct"]["median"], row["cold"]["delivered_builds_to_2pct"]["median"]
        row["fewer_builds"] = round(1 - w / c, 3) if w is not None and c else None
        out[name] = row
    return out


def _save(doc: dict[str, Any], path: Path) -> None:
    """Write the results file atomically: an interrupted write leaves the previous file (what --resume reads)."""
    atomic_write(path, json.dumps(doc, indent=1, default=str))


def resumed_strategies(path: Path) -> list[str] | None:
    """The strategies of the results file at `path` (what --resume without --strategies goes on with), in its order;
    None when it cannot be read or names none this benchmark knows."""
    try:
        names = [n for n in json.loads(path.read_text()).get("strategies", {}) if n in STRATEGIES]
    except (OSError, ValueError, AttributeError):
        return None
    return names or None


def dates(now: str, previous: dict[str, Any]) -> dict[str, str]:
    """When the results were generated: the first piece's start where they go on from earlier pieces' results (and
    `resumed`: this piece's start), else `now`."""
    if previous.get("results") and previous.get("generated"):
        return {"generated": previous["generated"], "resumed": now}
    return {"generated": now}


def earlier_results(path: Path, settings: dict[str, Any], scenarios: Sequence[Scenario]) -> dict[str, Any]:
    """The results file at `path` when it was written with `settings` (for --resume), else nothing; its scenarios
    only where their landscape file is the same."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if old.get("settings") != settings:
        print(f"{path}: other settings ({old.get('settings')}); starting over", file=sys.stderr)
        return {}
    same = {
        sc.name
        for sc in scenarios
        if old.get("scenarios", {}).get(sc.name, {}).get("facts") == truth_for(sc).describe()
    }
    return {
        "generated": old.get("generated"),
        "scenarios": {n: v for n, v in old.get("scenarios", {}).items() if n in same},
        "results": {n: v for n, v in old.get("results", {}).items() if n in same},
        "transfer": old.get("transfer", {}) if same == {sc.name for sc in scenarios} else {},
    }


def _progress(i: int, n: int, t0: float) -> None:
    if i % 100 == 0 or i == n:
        rate = (time.monotonic() - t0) / i
        print(f"{i}/{n} runs, eta {rate * (n - i) / 60:.1f} min", file=sys.stderr, flush=True)


SHARES = tuple(f"delivered_within_2pct_at_{b}" for b in BUDGETS)


def _summary(runs: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    keys = (
        [f"delivered_builds_to_{round(lv * 100)}pct" for lv in LEVELS]
        + [f"delivered_regret_at_{b}" for b in BUDGETS if b <= budget]
        + [f"builds_to_{round(lv * 100)}pct" for lv in LEVELS]
        + [f"regret_at_{b}" for b in BUDGETS if b <= budget]
        + [f"confirm_processes_at_{b}" for b in BUDGETS if b <= budget]
        + ["wasted_fraction", "pruned_fraction", "builds", "trials", "timing_s_per_timed_trial", "remeasures"]
    )
    out: dict[str, Any] = {k: summarise([r.get(k) for r in runs]) for k in keys if any(k in r for r in runs)}
    out.update({k: share([r[k] for r in runs]) for k in SHARES if runs and k in runs[0]})
    for curve in ("curve", "delivered_curve"):
        length = max(len(r[curve]) for r in runs)
        padded = [r[curve] + [r[curve][-1] if r[curve] else None] * (length - len(r[curve])) for r in runs]
        out[f"median_{curve}"] = [summarise(col)["median"] for col in zip(*padded)] if runs else []
    out["runs"] = [{k: v for k, v in r.items() if k not in ("curve", "delivered_curve")} for r in runs]
    return out


def measurement_facts(truth: Truth, share: float, top: int = 5, repeats: int = 20) -> dict[str, Any]:
    """How the tuner's paired measurement behaves on this landscape's replay: the `top` truly fastest feasible
    routes, each measured `repeats` times against the default route by the simulated child: the spread of the
    measured log speedup, the mean half-width of its interval and what stopped the measurements."""
    import tempfile

    import numpy as np
    import optuna

    from bench.landscape.simulate import Simulation

    with tempfile.TemporaryDirectory(prefix="search-facts-") as tmp:
        sim = Simulation(truth, optuna.samplers.RandomSampler(0), Path(tmp), share, seed=11, recommended=False)
        sim.step()  # the baseline trial
        base = sim.baseline()
        engine = sim.engine(base) if base is not None else None
        keys = [k for k in sorted(truth.truth, key=truth.truth.__getitem__) if k != sim.default][:top]
        routes = {p.key: p.route for p in truth.landscape.points}
        rows = [
            [sim.child(routes[k], sim.backend, f"facts-{k}-{i}", baseline=engine).paired for i in range(repeats)]
            for k in keys
        ]
    paired = [[p for p in row if p.get("paired")] for row in rows]
    stops = [p.get("stop", "") for row in paired for p in row]
    return {
        "routes": len(keys),
        "repeats": repeats,
        "drift_share": share,
        "ratio_sd": [round(float(np.std([math.log(p["speedup"]) for p in row])), 4) if row else None for row in paired],
        "mean_half_width": round(float(np.mean([p["halfwidth"] for row in paired for p in row])), 4) if stops else None,
        "stopped": {why: stops.count(why) for why in ("precision", "cap", "slow")},
    }


# -- choosing the default ---------------------------------------------------------------------------

CHOICE_BUDGET = 30
CHOICE_MARGIN_SEEDS = 2  # a challenger must be better by this many seeds (a share of 2/seeds) to replace the default


def choose_default(doc: dict[str, Any], current: str | None = None) -> dict[str, Any]:
    """Pick the default sampler from the tuning scenarios only.

    Key, in order: the lowest share (over tuning scenarios) of seeds delivered within 2 % at
    CHOICE_BUDGET builds, then its mean. The current default stays unless a candidate beats it on
    the first key by a margin of CHOICE_MARGIN_SEEDS seeds (as a share of the seeds per cell), or
    ties within the margin and beats it on the second by it.
    """
    current = current or RunSpec(budget=1).sampler
    tuning = [n for n, sc in doc["scenarios"].items() if not sc["held_out"]]
    key = f"delivered_within_2pct_at_{CHOICE_BUDGET}"
    table = {}
    for strat in (
        s for s in doc["strategies"] if STRATEGIES[s].candidate and all(s in doc["results"][sc] for sc in tuning)
    ):
        shares = [doc["results"][sc][strat][key]["share"] for sc in tuning]
        seeds = min(doc["results"][sc][strat][key]["n"] for sc in tuning)
        table[strat] = {
            "min_share": min(shares),
            "mean_share": round(sum(shares) / len(shares), 5),
            "shares": dict(zip(tuning, shares)),
            "margin": round(CHOICE_MARGIN_SEEDS / seeds, 5),
        }
    best = max(table, key=lambda n: (table[n]["min_share"], table[n]["mean_share"], n == current))
    b, c = table[best], table[current]
    margin = max(b["margin"], c["margin"]) - 1e-9  # shares of whole seeds: a lead of exactly the margin counts
    better = b["min_share"] >= c["min_share"] + margin or (
        b["min_share"] > c["min_share"] - margin and b["mean_share"] >= c["mean_share"] + margin
    )
    chosen = best if better else current
    held = [n for n, sc in doc["scenarios"].items() if sc["held_out"]]
    return {
        "rule": choose_default.__doc__.split("\n\n")[1].replace("\n    ", " ").strip(),
        "budget": CHOICE_BUDGET,
        "margin_seeds": CHOICE_MARGIN_SEEDS,
        "tuning_scenarios": tuning,
        "held_out": held,
        "candidates": table,
        "chosen": chosen,
        "previous": current,
        "held_out_result": {
            sc: {k: doc["results"][sc][chosen][k] for k in SHARES if k in doc["results"][sc][chosen]} for sc in held
        },
    }


# -- report ---------------------------------------------------------------------------------------


def _cell(s: dict[str, Any], fmt: str, budget: int) -> str:
    if "share" in s:
        return "-" if s["share"] is None else f"{100 * s['share']:.0f}%"

    def f(v: float | None) -> str:
        if v is None:
            return f">{budget}" if fmt == "builds" else "∞"
        return f"{100 * v:.1f}%" if fmt == "pct" else f"{v:.0f}" if fmt in ("builds", "count") else f"{v:.2f}"

    return f"{f(s['median'])} [{f(s['q25'])}–{f(s['q75'])}]"


def _table(doc: dict[str, Any], metric: str, title: str, fmt: str, names: Sequence[str]) -> list[str]:
    budget = doc["settings"]["budget"]
    lines = [
        "",
        f"**{title}**",
        "",
        "| Strategy | " + " | ".join(_col(doc, n) for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for strat in doc["strategies"]:
        if all(metric in doc["results"][sc].get(strat, {}) for sc in names):
            lines.append(
                f"| `{strat}` | "
                + " | ".join(_cell(doc["results"][sc][strat][metric], fmt, budget) for sc in names)
                + " |"
            )
    return lines


def _col(doc: dict[str, Any], name: str) -> str:
    return f"{name} (held out)" if doc["scenarios"][name]["held_out"] else name


def markdown(doc: dict[str, Any]) -> str:
    """The result tables (share of seeds, or median [IQR] over seeds) for docs/search-efficiency.md."""
    budget = doc["settings"]["budget"]
    budgets = [b for b in doc["settings"]["budgets"] if b <= budget]
    names = list(doc["scenarios"])
    lines = [
        f"Generated by `python bench/search_efficiency.py` on {doc['generated']}"
        + (f" (last resumed {doc['resumed']})" if doc.get("resumed") else "")
        + f": {doc['settings']['seeds']} seeds "
        f"per cell, budget {budget} builds; shares are of seeds, other cells median [25th–75th percentile] over seeds. "
        f"`>{budget}`: not reached within the budget; ∞: nothing feasible delivered. Every study strategy runs the "
        "tuner's study, measurement, racing and confirmation through the simulation runner; un-paired recordings are "
        f"replayed with drift share {doc['settings']['unpaired_drift_share']:g}."
        + (f" {doc['note']}" if doc.get("note") else ""),
        "",
    ]
    lines += [
        "| Scenario | tolerance | routes | failing | feasible | within 2 % | within 5 % | default | true best | "
        "fastest (any accuracy) | round-to-round spread |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, sc in doc["scenarios"].items():
        d = sc["facts"]
        lines.append(
            f"| {_col(doc, name)} | {sc['metric']} ≤ {sc['tolerance']:g} | {d['routes']} | {d['failing']} | "
            f"{d['feasible']} | {d['within_2pct']} | {d['within_5pct']} | {_ms(d['default_ms'])} | "
            f"{_ms(d['best_ms'])} | {_ms(d['fastest_any_ms'])} | {d['round_spread']:.2f}× |"
        )
    if all("paired_measurement" in sc for sc in doc["scenarios"].values()):
        lines += [
            "",
            "**The paired measurement on each replay** (the 5 truly fastest feasible routes against the default, "
            "20 measurements each by the simulated child): spread of the measured log speedup between measurements, "
            "mean half-width of its interval, and what stopped the measurements.",
            "",
            "| Scenario | drift share | spread | mean half-width | stopped at the cap |",
            "|---|---|---|---|---|",
        ]
        for name, sc in doc["scenarios"].items():
            f = sc["paired_measurement"]
            n = max(1, sum(f["stopped"].values()))
            sds = [v for v in f["ratio_sd"] if v is not None]
            lines.append(
                f"| {_col(doc, name)} | {f['drift_share']:g} | {100 * min(sds):.1f}–{100 * max(sds):.1f} % | "
                f"±{100 * (f['mean_half_width'] or 0):.1f} % | {100 * f['stopped']['cap'] / n:.0f} % |"
            )
    if "choice" in doc:
        c = doc["choice"]
        lines += [
            "",
            f"**Choosing the default sampler** (tuning scenarios: {', '.join(c['tuning_scenarios'])}; held out: "
            f"{', '.join(c['held_out'])}). Rule: {c['rule']} Chosen: `{c['chosen']}` (previous default "
            f"`{c['previous']}`).",
            "",
            "| Candidate | "
            + " | ".join(f"{sc}: within 2 % at {c['budget']}" for sc in c["tuning_scenarios"])
            + " | lowest | mean |",
            "|---|" + "---|" * (len(c["tuning_scenarios"]) + 2),
        ]
        for strat, t in c["candidates"].items():
            lines.append(
                f"| `{strat}` | "
                + " | ".join(f"{100 * t['shares'][sc]:.0f}%" for sc in c["tuning_scenarios"])
                + f" | {100 * t['min_share']:.0f}% | {100 * t['mean_share']:.0f}% |"
            )
    if doc.get("transfer"):
        lines += [
            "",
            f"**Transfer, leave one model out** (the default sampler; sources: the other models' studies of "
            f"{TRANSFER_SOURCE_BUILDS} builds in the same storage, never the same model): builds until the delivered "
            "route stays within 2 % (median [IQR]) and the share of seeds within 2 % at 30 builds, with the warm "
            "start and without.",
            "",
            "| Scenario | sources | builds to 2 %, warm | builds to 2 %, cold | fewer builds | within 2 % at 30, warm "
            "| cold |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, row in doc["transfer"].items():
            w, c = row["warm"], row["cold"]
            fewer = "-" if row["fewer_builds"] is None else f"{100 * row['fewer_builds']:.0f} %"
            lines.append(
                f"| {_col(doc, name)} | {', '.join(row['sources'])} | "
                f"{_cell(w['delivered_builds_to_2pct'], 'builds', budget)} | "
                f"{_cell(c['delivered_builds_to_2pct'], 'builds', budget)} | {fewer} | "
                f"{_cell(w['delivered_within_2pct_at_30'], 'share', budget)} | "
                f"{_cell(c['delivered_within_2pct_at_30'], 'share', budget)} |"
            )
    for b in budgets:
        lines += _table(
            doc,
            f"delivered_within_2pct_at_{b}",
            f"Delivered within 2 % of the true best after {b} builds (share of seeds)",
            "share",
            names,
        )
    lines += _table(
        doc,
        "delivered_builds_to_2pct",
        "Builds until the delivered route is within 2 % of the true best and stays there",
        "builds",
        names,
    )
    for b in budgets:
        lines += _table(
            doc,
            f"delivered_regret_at_{b}",
            f"Delivered regret after {b} builds (true latency of the delivered route / true best − 1)",
            "pct",
            names,
        )
    lines += _table(
        doc,
        "builds_to_2pct",
        "Secondary — builds until a route within 2 % of the true best was *built* (whether or not it is delivered)",
        "builds",
        names,
    )
    for b in budgets:
        lines += _table(
            doc, f"regret_at_{b}", f"Secondary — regret of the best route *built* after {b} builds", "pct", names
        )
    for metric, title, fmt in (
        ("wasted_fraction", "Share of builds spent on infeasible or failing routes", "pct"),
        ("pruned_fraction", "Share of builds whose timing stopped early as clearly slower (ours)", "pct"),
        (
            "timing_s_per_timed_trial",
            "Paired timing per timed trial, racing included (seconds of timed calls, ours)",
            "secs",
        ),
        ("remeasures", "Racing re-measurements per run (ours)", "count"),
        (
            f"confirm_processes_at_{CHOICE_BUDGET}",
            f"Processes of the end-of-study confirmation after {CHOICE_BUDGET} builds (ours)",
            "count",
        ),
        ("builds", "Builds made (a strategy may stop early or run out of trials)", "count"),
        ("trials", f"Trials used (cache hits included; runs stop at {doc['settings']['trial_cap']} trials)", "count"),
    ):
        lines += _table(doc, metric, title, fmt, names)
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
    """Median delivered curves (true latency of the delivered route / true best) per scenario."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(doc["scenarios"])
    cols = min(2, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False)
    styles = {
        "local": dict(color="black", lw=2.5),
        "local-previous": dict(color="black", ls="--", lw=1.5),
        "local-forest": dict(color="black", ls=":", lw=1.5),
        "tpe": dict(color="tab:blue", lw=1.5),
        "smac": dict(color="tab:green", lw=1.5),
        "random": dict(color="tab:gray", ls="--", lw=2),
        "gpt-fast": dict(color="tab:red", lw=2),
        "gpt-mixed": dict(color="tab:orange", lw=2),
        "olive": dict(color="tab:purple", lw=2),
    }
    for ax, name in zip(axes.flat, names):
        for strat in (s for s in doc["strategies"] if s in styles and s in doc["results"][name]):
            curve = doc["results"][name][strat]["median_delivered_curve"]
            y = [c if c is not None else float("nan") for c in curve]
            ax.plot(range(1, len(y) + 1), y, label=strat, **styles[strat])
        ax.axhline(1.02, color="green", lw=0.8, ls=":")
        ax.set_yscale("log")
        ax.set_ylim(0.99, 3.0)
        ax.set_yticks([1, 1.1, 1.2, 1.5, 2, 3], ["1", "1.1", "1.2", "1.5", "2", "3"])
        ax.minorticks_off()
        ax.set_title(
            f"{_col(doc, name)} ({doc['scenarios'][name]['metric']} ≤ {doc['scenarios'][name]['tolerance']:g})"
        )
        ax.set_xlabel("builds")
        ax.set_ylabel("delivered / true best (median)")
    for ax in list(axes.flat)[len(names) :]:
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
    p.add_argument(
        "--strategies",
        nargs="*",
        choices=list(STRATEGIES),
        help="default: with --resume those of the results file, else every strategy of DEFAULT_SET",
    )
    p.add_argument(
        "--scenarios",
        nargs="*",
        default=[s.name for s in SCENARIOS],
        choices=[s.name for s in SCENARIOS],
        help="scenarios to run (those whose landscape file is missing are skipped)",
    )
    p.add_argument("--json", type=Path, default=REPO / "bench/results/search-efficiency.json")
    p.add_argument("--markdown", type=Path, default=REPO / "docs/search-efficiency.md")
    p.add_argument("--png", type=Path, default=REPO / "docs/img/search-efficiency.png")
    p.add_argument("--report-only", action="store_true", help="re-render the markdown and PNG from the JSON")
    p.add_argument(
        "--transfer", action=argparse.BooleanOptionalAction, default=True, help="the leave-one-model-out transfer rows"
    )
    p.add_argument(
        "--no-docs", action="store_true", help="write only the JSON (e.g. a longer budget for a few strategies)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the cells (scenario, strategy) and transfer rows the JSON already holds with the same settings",
    )
    p.add_argument(
        "--stop-after",
        type=float,
        default=math.inf,
        metavar="S",
        help="stop starting runs after S seconds and write the complete cells (a later --resume goes on)",
    )
    args = p.parse_args(argv)
    if args.report_only:
        try:
            doc = json.loads(args.json.read_text())
        except (OSError, ValueError) as exc:
            print(f"error: {args.json}: not a readable results file ({type(exc).__name__})", file=sys.stderr)
            return 2
        write_docs(doc, args.markdown)
        plot(doc, args.png)
        return 0
    if args.strategies is None:
        args.strategies = (resumed_strategies(args.json) if args.resume else None) or list(DEFAULT_SET)
    scenarios = [s for s in available(SCENARIOS) if s.name in args.scenarios]
    unmade = unmade_sampler(args.strategies, scenarios)
    if unmade:
        print(f"error: --strategies {unmade}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.stop_after
    import optuna

    doc: dict[str, Any] = {
        "generated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "settings": {
            "seeds": args.seeds,
            "budget": args.budget,
            "trial_cap": TRIAL_CAP * args.budget,
            "levels": list(LEVELS),
            "budgets": list(BUDGETS),
            "unpaired_drift_share": UNPAIRED_DRIFT_SHARE,
        },
        "environment": {
            "python": platform.python_version(),
            "optuna": optuna.__version__,
            "machine": platform.machine(),
            "cores": os.cpu_count(),
            "loadavg_start": list(os.getloadavg()),
        },
        "strategies": {n: STRATEGIES[n].label for n in args.strategies},
        "scenarios": {},
    }
    previous = earlier_results(args.json, doc["settings"], scenarios) if args.resume else {}
    doc.update(dates(doc["generated"], previous))
    for sc in scenarios:
        if sc.name in previous.get("scenarios", {}):
            doc["scenarios"][sc.name] = previous["scenarios"][sc.name]
            continue
        t = truth_for(sc)
        meta = t.landscape.meta
        doc["scenarios"][sc.name] = {
            "landscape": sc.landscape,
            "model": sc.model,
            "note": sc.note,
            "metric": t.metric,
            "tolerance": t.tolerance,
            "facts": t.describe(),
            "held_out": sc.held_out,
            "drift_share": drift_share(sc),
            "recorded": {
                "backend": meta["backend"],
                "environment": meta["environment"],
                "enumeration": meta["enumeration"],
            },
            "paired_measurement": measurement_facts(t, drift_share(sc)),
        }
    doc["results"] = run_all(
        scenarios, args.strategies, args.seeds, args.budget, args.jobs, previous.get("results"), deadline
    )
    if args.transfer:
        doc["transfer"] = run_transfer(
            scenarios, args.seeds, args.budget, args.jobs, previous.get("transfer"), deadline
        )
    doc["environment"]["loadavg_end"] = list(os.getloadavg())
    missing = [f"{sc}/{n}" for sc in doc["results"] for n in args.strategies if n not in doc["results"][sc]]
    missing += [
        sc.name
        for sc in scenarios
        if args.transfer and transfer_sources(sc, scenarios) and sc.name not in doc.get("transfer", {})
    ]
    if missing:
        doc["missing"] = missing
        _save(doc, args.json)
        print(f"stopped with {len(missing)} cells to go ({', '.join(missing)}): run again with --resume")
        return 3
    if (
        RunSpec(budget=1).sampler in args.strategies
        and args.budget >= CHOICE_BUDGET
        and any(sc.held_out for sc in scenarios)
        and any(not sc.held_out for sc in scenarios)
    ):
        doc["choice"] = choose_default(doc)
    _save(doc, args.json)
    if not args.no_docs:
        write_docs(doc, args.markdown)
        plot(doc, args.png)
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
