"""The simulation runner: a study run the way `tuner run` runs it, with only the trial's child replaced by a landscape.

Like Kernel Tuner's SimulationRunner, which replaces only the runner that compiles and benchmarks a
kernel, this replaces only what a trial's child process does — build and time — and keeps the rest:

- the child is the child's own code (`tuner.worker.child.run_trial`), run in this process on the
  replay backend bound to the landscape (`ReplayBackend(landscape)`): its build re-enacts a recorded
  round, the quick gate and the full accuracy are computed from the recorded outputs against the
  recorded reference, and the timing is the real paired measurement (`tuner.worker.timing.time_trial`,
  `tuner.measure.paired.measure_paired`) on a virtual clock that only replayed calls advance;
- the study is a real Optuna study (in memory) with the study's sampler, the default route and the
  backend's recommended routes enqueued first (`tuner.study.setup.enqueue_start`), outcomes recorded
  by `tuner.study.outcome.record`, each trial paired with the baseline engine and pruned against
  `tuner.study.racing.incumbent`, close leaders raced after every trial (`racing.standings`,
  `racing.to_race`, `racing.after_remeasure`) on their stored artifacts (`tuner.study.reuse`);
- what the study delivers is decided by the end-of-study confirmation (`tuner.worker.confirm.judge_study`,
  its runs replayed the same way) and the verdict (`tuner.study.verdict.decide`).

What stays here is the worker's glue: ask, suggest, a cache of deterministic results (a repeat is
not a build), the pairing of a trial, and keeping per-trial log ratios for racing.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from bench.landscape.truth import Truth
from tuner import job as J
from tuner.backends.base import Backend, ModelInfo
from tuner.backends.replay import DRIFT_SHARE, SEED, ReplayBackend
from tuner.backends.replay.build import ChildDeath
from tuner.backends.replay.landscape import feed_key
from tuner.backends.replay.run import CLOCK
from tuner.measure.exclusive import LOCK_DIR_ENV
from tuner.objective import ObjectiveSpec
from tuner.space import Route, route_hash
from tuner.study import attrs as A
from tuner.study import outcome, racing, warm_start
from tuner.study.reuse import StoredArtifactBackend
from tuner.study.setup import enqueue_start, seed_routes
from tuner.study.summary import summarize_study
from tuner.study.verdict import decide
from tuner.worker.child import Trial, run_trial
from tuner.worker.confirm import judge_study, pick_candidates

optuna.logging.set_verbosity(optuna.logging.ERROR)


@dataclass(frozen=True)
class Step:
    """One trial of a simulated study: its route, whether it cost a build, what was recorded, what the study delivers
    after it."""

    key: str
    build: bool
    status: str
    value: float | None  # the value told to Optuna (None unless COMPLETE)
    feasible: bool
    delivered: str | None = (
        None  # the route delivered now without a final confirmation: racing's confirmed best, else the default
    )
    pruned: bool = False  # timing stopped early as slower than the incumbent


@dataclass
class Simulation:
    """One study on a landscape; `step()` runs one trial as a worker does, `confirmation()` what `tuner run` would
    deliver now.

    `drift_share` is the replay's `drift_share` option (`tuner.backends.replay.run`) and `seed` its
    noise seed; `objective` the study's timing settings (a study file's defaults unless given);
    `racing` as `[run] racing`.
    """

    truth: Truth
    sampler: optuna.samplers.BaseSampler
    work_dir: Path
    drift_share: float = 1.0
    seed: int = 0
    objective: ObjectiveSpec = field(default_factory=ObjectiveSpec)
    racing: bool = True
    recommended: bool = True
    warm_start: bool = False  # `[run] warm_start = "auto"`: start from the other models' studies in `storage`
    extend_confirmation: bool = True  # the confirmation measures a near tie with the default on past its cap
    storage: optuna.storages.BaseStorage | None = None
    name: str = "simulated"
    study: optuna.Study = field(init=False)
    steps: list[Step] = field(default_factory=list)
    confirmed: dict[int, str] = field(default_factory=dict)  # builds -> the route delivered then (see `confirmation`)
    confirm_runs: dict[int, int] = field(default_factory=dict)  # builds -> processes of the confirmation behind it
    builds: int = 0
    remeasures: int = 0
    seconds: float = 0.0  # virtual seconds of timed calls (trials and racing; warm-up included)

    def __post_init__(self) -> None:
        self.feeds = [{"feed": np.array([i], dtype=np.int64)} for i in range(len(self.truth.landscape.feeds))]
        landscape = self.truth.landscape.with_feeds([feed_key(f) for f in self.feeds])
        self.backend = ReplayBackend(landscape)
        self.model = ModelInfo(Path("landscape"), {}, {DRIFT_SHARE.name: self.drift_share, SEED.name: self.seed})
        self.space = self.truth.space
        self.default = route_hash(self.space.default_route())
        self.cache: dict[str, J.Result] = {}
        self.artifacts: dict[str, str] = {}  # sha256 -> path of the stored artifact
        self.cycles: dict[
            int, list[list[float]]
        ] = {}  # trial number -> per-cycle log ratios of each paired measurement
        self.delivery: dict[tuple[int, ...], tuple[str, int]] = {}  # candidates -> the route delivered, processes
        self.runs = 0
        storage = self.storage or optuna.storages.InMemoryStorage()
        self.study = optuna.create_study(
            study_name=self.name, storage=storage, sampler=self.sampler, direction="minimize"
        )
        meta = self.truth.landscape.meta
        identity = warm_start.identity(
            meta.get("model", {}).get("sha256", ""), meta.get("environment", {}).get("device", {})
        )
        backend = meta["backend"].get("options", {}).get("capture_backend", meta["backend"]["name"])
        for key, value in {**identity, "backend": backend, "default_route": self.space.default_route()}.items():
            self.study.set_user_attr(key, value)
        seeds = seed_routes(self.backend, self.model, self.space) if self.recommended else []
        enqueue_start(self.study, self.space, seeds, budget=10**9)
        if self.warm_start:
            warm_start.warm_start(self.study, storage, self.space, self.study.user_attrs[A.BACKEND], identity)

    # -- the worker's loop ------------------------------------------------------------------------

    def step(self) -> Step:
        """Ask, suggest, evaluate (cache or child), record, race: one trial, as `tuner.worker.loop.Worker` runs it."""
        trial = self.study.ask()
        route = self.space.suggest(trial)
        result, extra, build = self.evaluate(trial, route)
        attrs = outcome.user_attrs(result, self.truth.metric, self.truth.tolerance, extra)
        base = self.baseline()
        j = outcome.record(
            self.study,
            trial,
            result,
            self.truth.tolerance,
            self.truth.statistic,
            attrs,
            base.value if base is not None else None,
        )
        if self.racing:
            self.race()
        step = Step(route_hash(route), build, result.status, j.value, j.feasible, self.raced(), result.status == J.SLOW)
        self.steps.append(step)
        return step

    def run(self, budget: int, checkpoints: tuple[int, ...] = (), trial_cap: int | None = None) -> list[Step]:
        """Trials until `budget` builds were made (or `trial_cap` trials asked, default 3 x budget); at each
        build count in `checkpoints` (and at the end) what the study delivers is kept in `confirmed`."""
        cap = trial_cap or 3 * budget
        while self.builds < budget and len(self.steps) < cap:
            if self.step().build and self.builds in checkpoints:
                self.confirmed[self.builds], self.confirm_runs[self.builds] = self.confirmation()
        if self.builds not in self.confirmed:
            self.confirmed[self.builds], self.confirm_runs[self.builds] = self.confirmation()
        return self.steps

    def baseline(self) -> FrozenTrial | None:
        """The completed baseline trial."""
        return racing.baseline_trial(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))

    def evaluate(self, trial: optuna.Trial, route: Route) -> tuple[J.Result, dict[str, Any], bool]:
        """(result, extra attributes, whether it cost a build): known-invalid, from the cache, or the child."""
        reason = self.space.check(route)
        if reason:
            return J.Result(status=J.INVALID_ROUTE, message=reason), {}, False
        key = route_hash(route)
        if key in self.cache:
            return self.cache[key], {"cache_hit": True}, False
        self.builds += 1
        result = self.child(route, self.backend, f"trial-{trial.number:05d}", **self.pairing(trial.number))
        if result.status in J.DETERMINISTIC:
            self.cache[key] = result
        if result.artifact_sha256 and result.artifact_path:
            self.artifacts[result.artifact_sha256] = result.artifact_path
        if result.paired.get("paired"):
            self.cycles[trial.number] = [list(result.paired["log_ratios"])]
        return result, {"cache_hit": False}, True

    def pairing(self, number: int) -> dict[str, Any]:
        """What trial `number` is timed against (as the worker pairs it): the baseline engine and the incumbent."""
        trials = self.study.get_trials(deepcopy=False)
        this = next(t for t in trials if t.number == number)
        if racing.is_baseline(this):
            return {"role": "baseline"}
        incumbent = racing.incumbent(trials, racing.races(self.study)) if self.racing else None
        base = racing.baseline_trial(trials)
        engine = self.engine(base) if base is not None else None
        return {"incumbent": incumbent, **({"baseline": engine} if engine else {})}

    def engine(self, trial: FrozenTrial) -> dict[str, Any] | None:
        """A trial's stored artifact as a job's `baseline` (`tuner.worker.race.Racer.baseline_engine`'s form)."""
        sha = trial.user_attrs.get(A.ARTIFACT_SHA256)
        path = self.artifacts.get(sha) if sha else None
        return {"trial": trial.number, "path": path, "sha256": sha, "route": dict(trial.params)} if path else None

    # -- the child, replaced by the landscape -------------------------------------------------------

    def job(self, route: Route, out_dir: Path, tolerance: float | None = None, **pairing: Any) -> J.Job:
        """The child's job for `route` (what `tuner.worker.jobs.make_job` makes of a study with this scenario)."""
        meta = self.truth.landscape.meta
        return J.Job(
            backend="replay",
            route=dict(route),
            model_path=str(self.model.path),
            input_shapes={},
            options=dict(self.model.options),
            work_dir=str(self.work_dir),
            out_dir=str(out_dir),
            feeds_path="",
            reference_path="",
            metric=self.truth.metric,
            tolerance=self.truth.tolerance if tolerance is None else tolerance,
            atol=meta["accuracy"]["atol"],
            rtol=meta["accuracy"]["rtol"],
            gate_samples=meta["data"]["gate_samples"],
            timeout_s=600.0,
            objective=replace(self.objective, statistic=self.truth.statistic),
            build_holds_cores=False,
            **pairing,
        )

    def child(
        self, route: Route, backend: Backend, name: str, tolerance: float | None = None, **pairing: Any
    ) -> J.Result:
        """What the trial's child returns for `route`: `run_trial` in this process; a recorded death of the
        child is recorded as the worker records one. `tolerance` overrides the scenario's (GPT and Olive time every
        route)."""
        self.runs += 1
        job = self.job(route, self.work_dir / name / "out", tolerance, **pairing)
        t = Trial.start(job, None, backend, self.feeds, self.backend.landscape.reference)
        before = CLOCK()
        try:
            with private_locks(self.work_dir / "locks"):
                result = run_trial(t)
        except ChildDeath as death:
            result = J.Result(status=death.status, message=death.message, phase=t.res.phase)
        self.seconds += CLOCK() - before
        return result

    def rerun(self, trial: FrozenTrial, label: str, **pairing: Any) -> J.Result:
        """The child on `trial`'s stored artifact (racing and confirmation runs: `tuner.study.reuse`)."""
        sha = trial.user_attrs.get(A.ARTIFACT_SHA256)
        path = self.artifacts.get(sha) if sha else None
        backend = StoredArtifactBackend(self.backend, Path(path) if path else None, sha)
        return self.child(dict(trial.params), backend, f"{label}-{self.runs:06d}", **pairing)

    # -- racing and delivery --------------------------------------------------------------------------

    def race(self) -> None:
        """One racing pass, as `tuner.worker.race.Racer.race` makes after each trial."""
        trials = self.study.get_trials(deepcopy=False)
        picked = racing.to_race(racing.standings(trials, racing.races(self.study)))
        base = racing.baseline_trial(trials)
        engine = self.engine(base) if base is not None else None
        if engine is None or base is None:
            return
        by_number = {t.number: t for t in trials}
        for number in picked:
            doc = racing.races(self.study)
            entry = dict(doc.get(str(number)) or {})
            if int(entry.get("remeasured", 0)) >= racing.REMEASURE_MAX:
                continue
            result = self.rerun(by_number[number], "race", baseline=engine)
            self.remeasures += 1
            ok = result.status == J.OK and bool(result.paired.get("paired"))
            if ok:
                self.cycles.setdefault(number, []).append(list(result.paired["log_ratios"]))
            failure = None if ok else f"{result.status}: {result.message}"
            doc[str(number)] = {
                **entry,
                **racing.after_remeasure(entry, self.cycles.get(number, []), failure, base.value),
            }
            self.study.set_user_attr(A.RACING, doc)

    def raced(self) -> str:
        """The fastest route racing has confirmed so far (`racing.best_confirmed`), else the default."""
        best = racing.best_confirmed(self.study.get_trials(deepcopy=False), racing.races(self.study))
        return route_hash(best.params) if best is not None else self.default

    def confirmation(self) -> tuple[str, int]:
        """The route `tuner run` with this budget would deliver now — the end-of-study confirmation of the top
        candidates (`judge_study`) and its verdict (`decide`): the confirmed winner, else the default route — and
        how many processes that confirmation ran.

        A confirmation is made again only when its candidates changed since the last one."""
        trials = self.study.get_trials(deepcopy=False)
        base = self.baseline()
        key = (
            tuple(t.number for t in pick_candidates(trials, base, 3, racing.races(self.study)))
            if base is not None and outcome.is_feasible(base)
            else ()
        )
        if key not in self.delivery:
            engine = (
                self.engine(base) if base is not None else None
            )  # each confirmation process pairs a candidate with it
            before = self.runs
            doc = judge_study(
                self.study,
                self.truth.statistic,
                lambda t, r: self.rerun(t, f"confirm-r{r}", baseline=engine),
                log=_quiet,
                extend=self.extend_confirmation,
            )
            head = decide(summarize_study(self.study), doc, trials, racing.races(self.study))
            exported = next((t for t in trials if t.number == head.export_trial), None)
            route = route_hash(exported.params) if exported is not None else self.default
            self.delivery[key] = (route, self.runs - before)
        return self.delivery[key]


def _quiet(line: str) -> None:
    """Confirmation progress lines are not shown."""


@contextmanager
def private_locks(directory: Path) -> Iterator[None]:
    """The timing locks of replayed trials in a directory of their own, never the host's (a replay takes no real
    time)."""
    before = os.environ.get(LOCK_DIR_ENV)
    os.environ[LOCK_DIR_ENV] = str(directory)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(LOCK_DIR_ENV, None)
        else:
            os.environ[LOCK_DIR_ENV] = before


def simulate(
    truth: Truth,
    sampler: optuna.samplers.BaseSampler,
    budget: int,
    drift_share: float = 1.0,
    seed: int = 0,
    checkpoints: tuple[int, ...] = (),
    **kw: Any,
) -> Simulation:
    """One study of `budget` builds in a temporary work dir (removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="simulated-study-") as tmp:
        sim = Simulation(truth, sampler, Path(tmp), drift_share, seed, **kw)
        sim.run(budget, checkpoints)
    return sim
