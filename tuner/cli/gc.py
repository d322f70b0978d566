"""`tuner gc`: list (by default) or delete the files of trials nobody needs, in a study's work dir."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tuner.cli.common import JsonOpt, SpecArg, StorageOpt, console, context, emit_json
from tuner.errors import TunerError
from tuner.study.gc import Plan, apply_plan, collecting, fmt_bytes, make_plan, refusal


def gc(
    spec: SpecArg,
    storage: StorageOpt = None,
    yes: Annotated[bool, typer.Option("--yes", help="Delete what is listed (without it, nothing is removed).")] = False,
    keep_best: Annotated[
        int | None, typer.Option("--keep-best", min=1, help="Feasible trials to keep (default: run.keep_best, 3).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove artifacts and trial folders of trials not kept: the baseline, the best feasible and confirmed ones
    stay."""
    ctx = context(spec, storage)
    study = ctx.load()
    if not yes:
        plan = make_plan(ctx, study, keep_best or ctx.spec.run.keep_best)
        if as_json:
            emit_json(_plan_json(plan, removed=False))
        else:
            _show(plan, "would remove", spec)
        return
    with collecting(ctx) as busy:
        plan = make_plan(
            ctx, study, keep_best or ctx.spec.run.keep_best
        )  # under the lock: what is deleted is what is listed
        why = busy or refusal(plan)
        if why:
            raise TunerError(why)
        if not as_json:
            _show(plan, "removing", spec)
        freed = apply_plan(ctx, plan)
    if as_json:
        emit_json({**_plan_json(plan, removed=True), "freed_bytes": freed})
        return
    _say(f"removed {len(plan.removals)} item(s), freed {fmt_bytes(freed)}")


def _plan_json(plan: Plan, removed: bool) -> dict[str, object]:
    """The plan as `tuner gc --json` prints it."""
    return {
        "study": plan.study,
        "work_dir": str(plan.work_dir),
        "work_dir_bytes": plan.work_dir_bytes,
        "kept": {str(n): why for n, why in sorted(plan.kept.items())},
        "removals": [
            {"path": str(r.path.relative_to(plan.work_dir)), "bytes": r.bytes, "reason": r.reason}
            for r in plan.removals
        ],
        "removed": removed,
        "running": plan.running,
    }


def _say(line: str) -> None:
    console.print(line, highlight=False, markup=False, soft_wrap=True)


def _show(plan: Plan, verb: str, spec: Path) -> None:
    _say(f"study {plan.study}: work dir {plan.work_dir} holds {fmt_bytes(plan.work_dir_bytes)}")
    _say(
        f"keeping {len(plan.kept)} trial(s): "
        + (", ".join(f"#{n} {why}" for n, why in sorted(plan.kept.items())) or "none")
    )
    _say(f"{verb} {len(plan.removals)} item(s), {fmt_bytes(plan.removable_bytes)}" + (":" if plan.removals else ""))
    for r in plan.removals:
        _say(f"  {fmt_bytes(r.bytes):>9}  {r.path.relative_to(plan.work_dir)}  {r.reason}")
    if verb != "removing":
        note = (
            f"; the study has {plan.running} RUNNING trial(s), so --yes waits until they finish" if plan.running else ""
        )
        _say(f"dry run: nothing was removed; `tuner gc {spec} --yes` deletes the items listed{note}")
