"""Create or resume a study: storage set-up, resume checks, baseline, validation data and reference.

`prepare` runs once per `tuner run` before any worker starts; `Context` is what a worker (or a
read-only command) needs to work on the study.
"""

from __future__ import annotations

import time
import uuid
import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import optuna
from sqlalchemy.orm import Session

from tuner.backends import get_backend
from tuner.backends.base import Backend, ModelInfo
from tuner.backends.device import hardware
from tuner.errors import ResumeError, TunerError
from tuner.measure.inputs import feeds_hash, file_hash, load_feeds, save_feeds
from tuner.measure.reference import cached_reference
from tuner.space import Route, SearchSpace
from tuner.spec import Spec
from tuner.store.db import check_reachable, get_engine, retried, schema_lock, study_lock, upgrade_schema
from tuner.store.models import StudyRecord
from tuner.store.readonly import has_optuna_schema
from tuner.store.urls import mask_credentials, mask_url
from tuner.study import attrs as A
from tuner.study import warm_start
from tuner.study.fingerprint import DEVICE, completed, device_problem, differences, study_fingerprint
from tuner.study.optuna_adapter import open_storage
from tuner.study.racing import BASELINE_SOURCE
from tuner.version import __version__

METRIC_NAMES = ["latency_ms"]
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
optuna.logging.set_verbosity(optuna.logging.WARNING)


def set_up_storage(url: str) -> optuna.storages.RDBStorage:
    """Create or migrate our tables, then Optuna's, under the schema lock (first-time set-ups may race).

    Ours first: a tuner schema newer than this code is refused before Optuna writes anything.
    """
    with schema_lock(url):
        upgrade_schema(url)
        return open_storage(url)


@dataclass
class Context:
    """A study file bound to a storage URL, with its backend and space (cheap to build)."""

    spec: Spec
    url: str

    @cached_property
    def backend(self) -> Backend:
        return get_backend(self.spec.backend.name)

    @cached_property
    def model_info(self) -> ModelInfo:
        shapes = tuple(
            ({k: tuple(v) for k, v in s["inputs"].items()}, float(s["weight"])) for s in self.spec.objective.shapes
        )
        return ModelInfo(self.spec.model.path, self.spec.model.inputs, self.spec.backend.options, shapes)

    @cached_property
    def space(self) -> SearchSpace:
        return (
            self.backend.space(self.model_info)
            .restrict(self.spec.backend.space)
            .within_cores(self.spec.objective.cores)
        )

    @cached_property
    def model_sha(self) -> str:
        return file_hash(self.spec.model.path)

    @cached_property
    def feeds(self) -> list[dict[str, Any]]:
        return load_feeds(self.spec)

    @cached_property
    def data_sha(self) -> str:
        return feeds_hash(self.feeds)

    @property
    def work_dir(self) -> Path:
        return self.spec.work_dir

    @cached_property
    def feeds_path(self) -> Path:
        """The validation feeds as a file for the trial child processes."""
        path = self.work_dir / "data" / f"feeds-{self.data_sha[:24]}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            save_feeds(path, self.feeds)
        return path

    @cached_property
    def reference_path(self) -> Path:
        """fp32 reference outputs, cached by (model, feeds), computed in a child process."""
        return cached_reference(
            self.work_dir / "data",
            f"{self.model_sha[:16]}{self.data_sha[:16]}",
            self.spec.model.path,
            self.feeds_path,
            self.spec.run.trial_timeout_s,
        )

    @cached_property
    def shape_sets(self) -> list[dict[str, Any]]:
        """Per `[[objective.shapes]]` entry: its inputs, weight, feeds file and reference file (computed once, cached
        by content like the study's own); empty without the section."""
        out = []
        for shape in self.spec.objective.shapes:
            feeds = load_feeds(self.spec, shape["inputs"])
            sha = feeds_hash(feeds)
            path = self.work_dir / "data" / f"feeds-{sha[:24]}.npz"
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                save_feeds(path, feeds)
            reference = cached_reference(
                self.work_dir / "data",
                f"{self.model_sha[:16]}{sha[:16]}",
                self.spec.model.path,
                path,
                self.spec.run.trial_timeout_s,
            )
            out.append({**shape, "feeds_path": str(path), "reference_path": str(reference)})
        return out

    @cached_property
    def trials_dir(self) -> Path:
        """This study's trial folders: keyed by the study's unique id, so one study file run against
        two storages (or a study re-created under the same name) never shares or overwrites them."""
        record = _study_record(self.url, self.spec.study)
        if record is None:
            raise TunerError(
                f"study {self.spec.study!r} does not exist in {mask_url(self.url)}; start it with `tuner run`"
            )
        return self.work_dir / "trials" / record.uid[:12]

    def fingerprint(self) -> dict[str, Any]:
        return study_fingerprint(self.spec, self.space, self.data_sha)

    def load(self, sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
        """Load the existing study (TunerError if it does not exist); creates nothing in the storage."""
        missing = f"study {self.spec.study!r} does not exist in {mask_url(self.url)}; start it with `tuner run`"
        if not has_optuna_schema(self.url):
            raise TunerError(missing)
        try:
            return optuna.load_study(
                study_name=self.spec.study, storage=open_storage(self.url, create_tables=False), sampler=sampler
            )
        except KeyError as exc:
            raise TunerError(missing) from exc


def seed_routes(backend: Backend, model: ModelInfo, space: SearchSpace) -> list[Route]:
    """The backend's recommended routes that are routes of `space`, other than its default."""
    return [r for r in backend.seed_routes(model) if space.contains(r) and r != space.default_route()]


def claim_device(ctx: Context) -> None:
    """Record this process's hardware as the study's if it has none; refuse it (TunerError) if it differs.

    Called by every worker before its first trial (each sees its own GPU), and by `tuner run` for CPU
    workers, which share its hardware, so a refusal is one line before any worker starts.
    """
    device = hardware(ctx.backend.device())
    with Session(get_engine(ctx.url)) as s, s.begin():  # the study's row lock, not the study lock: a short write
        record = s.get(StudyRecord, ctx.spec.study, with_for_update=True)
        if record is None:
            raise TunerError(
                f"study {ctx.spec.study!r} does not exist in {mask_url(ctx.url)}; start it with `tuner run`"
            )
        problem = device_problem(record.fingerprint, device, ctx.spec.run.mix_devices)
        if problem:
            raise TunerError(f"study {ctx.spec.study!r}: {problem} in {ctx.spec.path.name}")
        if DEVICE not in record.fingerprint:
            record.fingerprint = {**record.fingerprint, DEVICE: device}


def prepare(ctx: Context) -> optuna.Study:
    """Set up storage, create or check the study, enqueue the baseline once, and cache the reference.

    Nothing is written to the database before the storage answers and the study file is known to be
    compatible with an existing study of the same name.
    """
    check_reachable(ctx.url)
    storage = set_up_storage(ctx.url)  # first: refuses a schema newer than this code before anything is written
    fingerprint = ctx.fingerprint()
    ctx.reference_path  # noqa: B018 - compute once (in a child), before the workers need it
    ctx.shape_sets  # noqa: B018 - and at every [[objective.shapes]] entry
    preparation = ctx.backend.preparation(ctx.model_info, ctx.space, ctx.work_dir)  # cached by content: slow once
    seeds = seed_routes(ctx.backend, ctx.model_info, ctx.space)
    with study_lock(ctx.url, ctx.spec.study):
        with Session(get_engine(ctx.url)) as s, s.begin():
            record = s.get(StudyRecord, ctx.spec.study)
            if record is not None:
                diff = differences(record.fingerprint, fingerprint)
                if diff:
                    raise ResumeError(
                        f"study {ctx.spec.study!r} in {mask_url(ctx.url)} was created from an incompatible study file: "
                        f"{'; '.join(diff)}. To start a new study instead, change [study] name in {ctx.spec.path.name}"
                    )
                if (
                    completed(record.fingerprint, fingerprint) != record.fingerprint
                ):  # an older route-tuner's: record what it lacked
                    record.fingerprint = completed(record.fingerprint, fingerprint)
            else:
                s.add(
                    StudyRecord(
                        name=ctx.spec.study,
                        uid=uuid.uuid4().hex,
                        fingerprint=fingerprint,
                        spec_text=mask_credentials(ctx.spec.path.read_text(), ctx.url),
                        created_at=time.time(),
                    )
                )
        study = optuna.create_study(
            study_name=ctx.spec.study, storage=storage, direction="minimize", load_if_exists=True
        )
        created = not study.user_attrs.get(A.TUNER_VERSION)
        identity = warm_start.identity(ctx.model_sha, ctx.backend.device())
        if created:
            for key, value in identity.items():
                study.set_user_attr(key, value)
            study.set_metric_names(METRIC_NAMES)
            study.set_user_attr(A.TUNER_VERSION, __version__)
            study.set_user_attr(A.BACKEND, ctx.spec.backend.name)
            study.set_user_attr(A.BACKEND_VERSION, ctx.backend.version())
            study.set_user_attr(A.DEFAULT_ROUTE, ctx.space.default_route())
            study.set_user_attr(A.BUDGET, ctx.spec.run.budget)
            study.set_user_attr(A.PREPARATION, preparation)
            for key, value in ctx.backend.study_attrs(ctx.model_info).items():
                study.set_user_attr(key, value)
        enqueue_start(study, ctx.space, seeds, ctx.spec.run.budget)
        if (
            created and ctx.spec.run.warm_start == "auto"
        ):  # other models' winners, after the default and the recommended routes
            warm_start.warm_start(study, storage, ctx.space, ctx.spec.backend.name, identity)
    return study


def enqueue_start(study: optuna.Study, space: SearchSpace, seeds: list[Route], budget: int) -> None:
    """Enqueue the default route (the baseline) once, then the compiler's recommended routes `seeds`,
    as many as the budget leaves room for (a seed never waits past the budget)."""
    study.enqueue_trial(space.default_route(), user_attrs={A.SOURCE: BASELINE_SOURCE}, skip_if_exists=True)
    room = budget - len(study.get_trials(deepcopy=False))
    for route in seeds[: max(0, room)]:
        study.enqueue_trial(route, user_attrs={A.SOURCE: "recommended"}, skip_if_exists=True)


@retried
def _study_record(url: str, study: str) -> StudyRecord | None:
    """The study's record (None: no such study), waiting out a database outage as every worker read does: a worker
    may first need it while the database is away."""
    with Session(get_engine(url)) as s:
        return s.get(StudyRecord, study)
