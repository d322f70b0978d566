"""Export a trial as a directory a deployment engineer can run as is (`tuner best --export DIR [--trial N]`).

`export_choice` picks the trial (what the verdict says, or the one asked for); `export_trial` writes
the engine file (re-hashed: refused if it changed since it was recorded), the backend's native
reproduction (`Backend.deployment`: e.g. ONNX Runtime's `session.json` and `run_onnxruntime.py`,
TensorRT's `trtexec.sh` and `build_engine.py`), `reproduce.sh` (run from the directory), `route.json`,
`best.json` and a README saying what the route changes from the default route, in words. Everything
is written through `ExportWriter`: all or nothing, never through a symbolic link.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial

from tuner.backends.base import Deployment, ExportRequest
from tuner.errors import TunerError
from tuner.export.describe import change_lines
from tuner.export.readme import FILES, Measured, readme
from tuner.export.writer import ExportWriter
from tuner.space import SearchSpace
from tuner.store.cache import ResultStore
from tuner.study import attrs as A
from tuner.study.outcome import is_feasible, measured_latency
from tuner.study.racing import baseline_trial, races
from tuner.study.verdict import SPEEDUP, Headline, confirmed_row, study_estimate

if TYPE_CHECKING:
    from tuner.study.setup import Context

__all__ = ["export_choice", "export_trial", "route_space"]


def export_choice(study: optuna.Study, head: Headline, asked: int | None) -> tuple[FrozenTrial, str]:
    """The trial an export writes and why: the one asked for, else what the verdict says."""
    if asked is not None:
        chosen = next((t for t in study.get_trials(deepcopy=False) if t.number == asked), None)
        if chosen is None or not is_feasible(chosen):
            raise TunerError(f"--trial {asked}: no feasible trial with that number in study {study.study_name!r}")
        return chosen, f"trial {asked} as asked for with --trial (verdict: {head.verdict})"
    if head.export_trial is None:
        best = f"trial {head.trial.number}" if head.trial else "no route"
        raise TunerError(
            f"not exporting: the study's verdict is {head.verdict} ({best} is not confirmed); run `tuner run` to "
            f"confirm, or export it anyway with --trial {head.trial.number if head.trial else 'N'}"
        )
    chosen = next(t for t in study.get_trials(deepcopy=False) if t.number == head.export_trial)
    if head.verdict == SPEEDUP:
        return chosen, f"the confirmed winner, trial {chosen.number}"
    return chosen, f"the default route, trial {chosen.number}: the verdict is {head.verdict}"


def route_space(ctx: Context) -> SearchSpace | None:
    """The study's space, for the knobs' descriptions; None where this machine cannot build it (no TensorRT, no
    torch)."""
    try:
        return ctx.space
    except (TunerError, ImportError):
        return None


def model_inputs(ctx: Context) -> dict[str, dict[str, Any]]:
    """Each model input's shape, dtype, batch axis and (for a study-file constant) value."""
    model, constants = ctx.spec.model, ctx.spec.data.inputs
    out: dict[str, dict[str, Any]] = {}
    for name, shape in model.inputs.items():
        out[name] = {"shape": list(shape), "dtype": model.dtypes[name], "batch_axis": model.batch_axis(name)}
        given = constants.get(name)
        if given is not None and given.value is not None:
            out[name]["value"] = given.value
    return out


def measured_shapes(
    ctx: Context, trial: FrozenTrial | None = None, figures: Sequence[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    """The input shapes the study measured at, each with its weight, and with `trial` what it measured there:
    the default's and the route's latency (ms), the speedup and its interval (None where it was not timed paired);
    `figures` (per shape, e.g. `Headline.shapes`: the confirmation's or racing's) in place of the trial's own."""
    declared = [dict(s) for s in ctx.spec.objective.shapes] or [
        {"inputs": {k: list(v) for k, v in ctx.spec.model.inputs.items()}, "weight": 1.0}
    ]
    if trial is None:
        return declared
    a = trial.user_attrs
    measured = a.get(A.SHAPES) or [
        {
            "default_ms": (a.get(A.MEASURED_MS) or {}).get("default"),
            "route_ms": (a.get(A.MEASURED_MS) or {}).get("trial"),
            "speedup": a.get(A.SPEEDUP_PAIRED),
            "ci": a.get(A.SPEEDUP_PAIRED_CI),
        }
    ]
    keys = ("default_ms", "route_ms", "speedup", "ci")
    return [{**d, **{k: m.get(k) for k in keys}} for d, m in zip(declared, list(figures) or measured)]


def machine_share(ctx: Context, trial: FrozenTrial | None = None) -> dict[str, Any]:
    """The deployment's share of the machine the study was timed with: contention mode, cores, and (with a trial)
    the cores its timing ran on."""
    out: dict[str, Any] = {"contention": ctx.spec.objective.contention, "cores": ctx.spec.objective.cores}
    if trial is not None and trial.user_attrs.get(A.AFFINITY) is not None:
        out["affinity"] = trial.user_attrs[A.AFFINITY]
    return out


def export_trial(ctx: Context, doc: dict[str, Any], choice: tuple[FrozenTrial, str], out: Path) -> str:
    """Write the chosen trial's deployable export into `out`; one line saying what was written."""
    trial, reason = choice
    sha = trial.user_attrs.get(A.ARTIFACT_SHA256)
    record = ResultStore(ctx.url).artifact(sha) if sha else None
    if record is None or not Path(record.path).exists():
        raise TunerError(
            f"the artifact of trial {trial.number} is not in this machine's work dir ({ctx.work_dir}); "
            "export it where the study ran"
        )
    study = ctx.load()
    environment = trial.user_attrs.get(A.ENVIRONMENT)
    request = ExportRequest(
        route=dict(trial.params),
        artifact=Path(record.path),
        build_info=dict(trial.user_attrs.get(A.BUILD_INFO) or {}),
        model=ctx.model_info,
        work_dir=ctx.work_dir,
        inputs=model_inputs(ctx),
        shapes=measured_shapes(ctx, trial),
        backend_version=str((environment or {}).get("version") or study.user_attrs.get(A.BACKEND_VERSION) or ""),
    )
    deployment = ctx.backend.deployment(request)
    changes = change_lines(trial.params, dict(study.user_attrs.get(A.DEFAULT_ROUTE) or {}), route_space(ctx))
    with ExportWriter(out) as writer:
        writer.copy(deployment.artifact_name, request.artifact, sha)
        files = _write_native(writer, deployment)
        exported = {
            "trial": trial.number,
            "route": trial.params,
            "artifact_sha256": sha,
            "value": trial.value,
            "reason": reason,
            "engine_file": deployment.artifact_name,
            "changes": changes,
        }
        writer.write("route.json", json.dumps(trial.params, indent=2, sort_keys=True) + "\n")
        writer.write("best.json", json.dumps({**doc, "exported": exported}, indent=2) + "\n")
        writer.write("reproduce.sh", reproduce_script(deployment, ctx.spec.path.name), executable=True)
        writer.write(
            "README.md",
            readme(
                _measured(ctx, study, trial, reason, doc, environment),
                changes,
                deployment,
                {
                    deployment.artifact_name: "the engine the study measured (its sha256 is in best.json)",
                    **files,
                    **FILES,
                },
            ),
        )
        writer.publish()
    return (
        f"exported {reason} to {out}: {deployment.artifact_name} (sha256 {sha[:12]}), {', '.join(files)}, "
        "reproduce.sh, README.md"
    )


def _write_native(writer: ExportWriter, deployment: Deployment) -> dict[str, str]:
    """Stage the backend's files; their names with one line each for the README."""
    about: dict[str, str] = {}
    for name, content in deployment.files.items():
        if isinstance(content, Path):
            writer.copy(name, content)
        else:
            writer.write(name, content, executable=name in deployment.executables)
        about[name] = deployment.about.get(name, "")
    return about


def reproduce_script(deployment: Deployment, spec_name: str) -> str:
    """reproduce.sh: the backend's commands, run from the export directory, after what they need."""
    lines = [
        "#!/bin/sh",
        "# Runs the exported engine natively from this directory.",
        f"# Needs: {deployment.needs or 'nothing native exists for this backend'}.",
        f"# With the tuner and the study file instead: tuner build {spec_name} --route route.json --out rebuilt/",
        "set -eu",
        'cd "$(dirname "$0")"',
    ]
    return "\n".join([*lines, *(deployment.commands or ["echo 'no native reproduction: see README.md'"])]) + "\n"


def _measured(
    ctx: Context,
    study: optuna.Study,
    trial: FrozenTrial,
    reason: str,
    doc: dict[str, Any],
    environment: dict[str, Any] | None,
) -> Measured:
    trials = study.get_trials(deepcopy=False)
    base = baseline_trial(trials)
    acc = dict(trial.user_attrs.get(A.ACCURACY) or {})
    return Measured(
        study=ctx.spec.study,
        backend=ctx.spec.backend.name,
        trial=trial.number,
        reason=reason,
        verdict=str(doc.get("headline", "")),
        statistic=ctx.spec.objective.statistic,
        latency_ms=measured_latency(trial),
        baseline_ms=measured_latency(trial, "default"),
        speedup=study_estimate(trial, base, races(study)),
        confirmed=confirmed_row(doc, trial.number),
        accuracy={**acc, "tolerance": ctx.spec.accuracy.tolerance},
        artifact_bytes=trial.user_attrs.get(A.ARTIFACT_BYTES),
        peak_memory_mb=trial.user_attrs.get(A.PEAK_MEMORY_MB),
        memory_kind=str(trial.user_attrs.get(A.MEMORY_KIND, "")),
        shapes=measured_shapes(ctx, trial),
        share=machine_share(ctx, trial),
        environment=environment,
    )
