"""`tuner gc`: list (by default) or delete the files of trials nobody needs, in a study's work dir."""

from __future__ import annotations

from typing import Annotated

import typer

from tuner.cli.common import SpecArg, StorageOpt, console, context
from tuner.study.gc import apply_plan, fmt_bytes, make_plan


def gc(
    spec: SpecArg,
    storage: StorageOpt = None,
    yes: Annotated[bool, typer.Option("--yes", help="Delete what is listed (without it, nothing is removed).")] = False,
    keep_best: Annotated[int | None, typer.Option("--keep-best", min=1, help="Feasible trials to keep (default: run.keep_best, 3).")] = None,
) -> None:
    """Remove artifacts and trial folders of trials not kept: the baseline, the best feasible and confirmed ones stay."""
    ctx = context(spec, storage)
    plan = make_plan(ctx, ctx.load(), keep_best or ctx.spec.run.keep_best)
    say = lambda line: console.print(line, highlight=False, markup=False, soft_wrap=True)  # noqa: E731
    say(f"study {plan.study}: work dir {plan.work_dir} holds {fmt_bytes(plan.work_dir_bytes)}")
    say(f"keeping {len(plan.kept)} trial(s): " + (", ".join(f"#{n} {why}" for n, why in sorted(plan.kept.items())) or "none"))
    verb = "removing" if yes else "would remove"
    say(f"{verb} {len(plan.removals)} item(s), {fmt_bytes(plan.removable_bytes)}" + (":" if plan.removals else ""))
    for r in plan.removals:
        say(f"  {fmt_bytes(r.bytes):>9}  {r.path.relative_to(plan.work_dir)}  {r.reason}")
    if not yes:
        note = f"; the study has {plan.running} RUNNING trial(s), so --yes waits until they finish" if plan.running else ""
        say(f"dry run: nothing was removed; `tuner gc {spec} --yes` deletes the items listed{note}")
        return
    freed = apply_plan(ctx, plan)
    say(f"removed {len(plan.removals)} item(s), freed {fmt_bytes(freed)}")
