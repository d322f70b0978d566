"""What `tuner gc` may delete from a study's work dir, and deleting it.

Kept, always: the baseline trial, the best `keep_best` feasible trials and every trial a
confirmation measured (their artifacts and trial folders); any artifact another study in the same
storage refers to; artifacts this storage does not know (another storage may share the work dir);
precision variants, reference outputs, validation feeds, compiler caches and trial logs. Removed:
the artifacts and trial folders of this study's other finished trials.

Also kept, while something may use them: the trials racing is re-measuring (claimed; a leader it
picks later, after its artifact was collected, is rebuilt from its route), and the folder of a trial
whose worker was reaped but may still be alive with its child building there (on this host: while
its PID lives; from another host: for `REAPED_HOLD` after its last heartbeat, by the database
clock). Deleting (`collecting`) holds the study lock, so no trial is asked, reaped or told
meanwhile, and is refused while the study has RUNNING trials (counted under that lock) or a
confirmation is measuring (its lock is taken without waiting: it measures candidates it chose
itself). Listing takes no lock and writes nothing.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from tuner.errors import TunerError
from tuner.store.db import confirmation_lock, db_now, get_engine, study_lock
from tuner.store.leases import may_be_alive
from tuner.store.models import ArtifactRecord, Lease
from tuner.study import attrs as A
from tuner.study import optuna_adapter as oa
from tuner.study import racing
from tuner.study.outcome import is_feasible
from tuner.study.setup import Context

MB = 1024 * 1024


def reaped_hold_s(ctx: Context) -> float:
    """How long after its last heartbeat a reaped worker on another host may still have a child at work."""
    return 2 * ctx.spec.run.trial_timeout_s + ctx.spec.run.grace_s


@dataclass(frozen=True)
class Removal:
    """One file or folder that would be deleted, and why it is not needed."""

    path: Path
    bytes: int
    reason: str
    sha256: str | None = None  # set for artifacts: their record goes too


@dataclass
class Plan:
    """What a collection would keep and remove in one study's work dir."""

    study: str
    work_dir: Path
    kept: dict[int, str]  # trial number -> why it is kept
    removals: list[Removal] = field(default_factory=list)
    work_dir_bytes: int = 0
    running: int = 0

    @property
    def removable_bytes(self) -> int:
        """Bytes the removals would free."""
        return sum(r.bytes for r in self.removals)


def kept_trials(study: optuna.Study, keep_best: int) -> dict[int, str]:
    """The trials whose files a user needs, with why: baseline, best `keep_best` feasible, confirmed."""
    trials = study.get_trials(deepcopy=False)
    why: dict[int, list[str]] = {}
    for t in trials:
        if t.user_attrs.get(A.SOURCE) == "baseline":
            why.setdefault(t.number, []).append("baseline")
    feasible = sorted(
        (t for t in trials if t.state == TrialState.COMPLETE and is_feasible(t)), key=lambda t: (t.value, t.number)
    )
    for rank, t in enumerate(feasible[:keep_best], 1):
        why.setdefault(t.number, []).append(f"best feasible #{rank}")
    confirmation = study.user_attrs.get(A.CONFIRMATION) or {}
    confirmed = {c.get("trial") for c in confirmation.get("candidates", [])} | {
        confirmation.get("trial"),
        confirmation.get("winner_trial"),
    }
    for number in sorted(n for n in confirmed if isinstance(n, int)):
        why.setdefault(number, []).append("confirmed")
    for number, reason in racing_uses(racing.races(study)).items():
        why.setdefault(number, []).append(reason)
    return {n: " + ".join(reasons) for n, reasons in why.items()}


def racing_uses(raced: racing.Races) -> dict[int, str]:
    """The trials racing is re-measuring now (claimed under the study lock, which collecting holds)."""
    return {int(n): "being re-measured" for n, entry in raced.items() if entry.get("claim")}


def live_children(ctx: Context, trials: list[FrozenTrial]) -> set[int]:
    """Finished trials whose worker was reaped but may still be alive, its child working in the trial's folder."""
    by_id = {oa.trial_id(t): t.number for t in trials if t.state.is_finished()}
    with Session(get_engine(ctx.url)) as s:
        reaped = s.scalars(select(Lease).where(Lease.study == ctx.spec.study, Lease.state == "reaped")).all()
    now = db_now(ctx.url)
    return {
        by_id[lease.trial_id]
        for lease in reaped
        if lease.trial_id in by_id and may_be_alive(lease, now, reaped_hold_s(ctx))
    }


def make_plan(ctx: Context, study: optuna.Study, keep_best: int) -> Plan:
    """What collecting `ctx`'s work dir would remove (nothing is touched)."""
    trials = study.get_trials(deepcopy=False)
    kept = kept_trials(study, keep_best)
    plan = Plan(
        ctx.spec.study,
        ctx.work_dir,
        kept,
        work_dir_bytes=size_of(ctx.work_dir),
        running=sum(1 for t in trials if t.state == TrialState.RUNNING),
    )
    needed = {_sha(t) for t in trials if t.number in kept} | _shas_of_other_studies(study)
    known = _known_artifacts(ctx.url)
    busy = live_children(ctx, trials)
    offered: set[str] = set()
    for t in trials:
        sha = _sha(t)
        if t.number in kept or t.number in busy or not t.state.is_finished():
            continue
        if sha and sha not in needed and sha in known and sha not in offered:
            offered.add(sha)
            plan.removals += [
                Removal(p, size_of(p), f"artifact of trial {t.number} (not kept)", sha)
                for p in _artifact_files(ctx, sha)
            ]
        folder = ctx.trials_dir / f"{t.number:05d}"
        if folder.is_dir():
            plan.removals.append(Removal(folder, size_of(folder), f"trial folder of trial {t.number} (not kept)"))
    plan.removals.sort(key=lambda r: (-r.bytes, str(r.path)))
    return plan


@contextlib.contextmanager
def collecting(ctx: Context) -> Iterator[str | None]:
    """Hold what deleting needs: the study lock and, taken without waiting, the confirmation lock.

    The block gets None when it may delete, else why not (a confirmation is measuring); plan and
    apply inside it, so the plan is the study's state while nothing else changes it.
    """
    with study_lock(ctx.url, ctx.spec.study), confirmation_lock(ctx.url, ctx.spec.study, wait=False) as confirming:
        yield (
            None
            if confirming is not None
            else f"a confirmation of study {ctx.spec.study!r} is measuring; collect after it"
        )


def refusal(plan: Plan) -> str | None:
    """Why `plan` must not be applied now (RUNNING trials), or None."""
    if plan.running:
        return (
            f"study {plan.study!r} has {plan.running} RUNNING trial(s): stop its workers (or let them finish) "
            "before `tuner gc --yes`"
        )
    return None


def apply_plan(ctx: Context, plan: Plan) -> int:
    """Delete what `plan` lists (refused while the study runs); returns the bytes freed. Call inside `collecting`."""
    why = refusal(plan)
    if why:
        raise TunerError(why)
    shas = sorted({r.sha256 for r in plan.removals if r.sha256})
    if shas:
        with Session(get_engine(ctx.url)) as s, s.begin():  # records first: never a record of a deleted file
            s.execute(delete(ArtifactRecord).where(ArtifactRecord.sha256.in_(shas)))
    for r in plan.removals:
        if r.path.is_dir():
            shutil.rmtree(r.path, ignore_errors=True)
        else:
            r.path.unlink(missing_ok=True)
    return plan.removable_bytes


def size_of(path: Path) -> int:
    """Bytes of a file, or of every file under a folder (0 if missing)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _sha(t: FrozenTrial) -> str | None:
    sha = t.user_attrs.get(A.ARTIFACT_SHA256)
    return str(sha) if sha else None


def _artifact_files(ctx: Context, sha: str) -> Iterable[Path]:
    """The artifact files of `sha` in this work dir (named <sha256><suffix>)."""
    folder = ctx.work_dir / "artifacts"
    return sorted(p for p in folder.glob(f"{sha}*") if p.name[:64] == sha) if folder.is_dir() else []


def _known_artifacts(url: str) -> set[str]:
    with Session(get_engine(url)) as s:
        return set(s.scalars(ArtifactRecord.__table__.select().with_only_columns(ArtifactRecord.sha256)))


def _shas_of_other_studies(study: optuna.Study) -> set[str]:
    """Artifacts any trial of another study in the storage refers to (through the shared result cache)."""
    storage = oa.storage_of(study)
    out: set[str] = set()
    for name in optuna.get_all_study_names(storage):
        if name != study.study_name:
            out |= {
                sha
                for t in optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
                if (sha := _sha(t))
            }
    return out


def enforce_cap(ctx: Context, study: optuna.Study) -> str | None:
    """Collect garbage if the work dir exceeds `run.max_disk_mb`; a line saying what was done, or None if within the
    cap."""
    cap = ctx.spec.run.max_disk_mb
    if cap is None or size_of(ctx.work_dir) <= cap * MB:
        return None
    with collecting(ctx) as busy:
        plan = make_plan(ctx, study, ctx.spec.run.keep_best)
        over = f"work dir {fmt_bytes(plan.work_dir_bytes)} exceeds run.max_disk_mb ({cap:g} MB)"
        if busy or plan.running:
            return f"{over}; not collected while {busy or f'{plan.running} trial(s) run'}"
        freed = apply_plan(ctx, plan)
    line = f"{over}: removed {len(plan.removals)} item(s) of trials not kept, {fmt_bytes(freed)}"
    left = plan.work_dir_bytes - freed
    if left > cap * MB:
        line += f"; what is kept is still {fmt_bytes(left)}: raise run.max_disk_mb or lower run.keep_best"
    return line


def fmt_bytes(n: int) -> str:
    """Bytes for humans (kB, MB, GB; powers of 1024)."""
    for unit, size in (("GB", MB * 1024), ("MB", MB), ("kB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
