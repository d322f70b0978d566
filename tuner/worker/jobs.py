"""The child's job for a route of a study, and what a kept measurement records of its pairing.

Used by every path that runs a route in a child: the worker loop, racing, confirmation, `tuner build`
and the landscape recorder.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner import job as J
from tuner.backends.base import Backend
from tuner.objective import cache_part
from tuner.spec import Spec
from tuner.study.setup import Context


def measurement_stats(result: J.Result) -> dict[str, Any]:
    """What a kept measurement records of its pairing: the ratio, its interval, the per-cycle log ratios, and with
    `[[objective.shapes]]` each shape's figures as the timing gave them (`shapes`: `tuner.measure.shapes.shape_entry`,
    its own log ratios included, which racing pools per shape)."""
    p = result.paired
    return (
        {
            "paired": {
                k: p[k]
                for k in ("paired", "speedup", "ci", "stop", "cycles", "log_ratios", "baseline_latency", "shapes")
                if k in p
            }
        }
        if p
        else {}
    )


def measure_settings(spec: Spec) -> dict[str, Any]:
    """What a trial's stored result depends on besides the model, data, backend and route (part of its cache key)."""
    return {
        **spec.accuracy.settings(),
        "gate": spec.data.gate_samples,
        "timing": cache_part(spec.objective),
    }


def preload(backend: Backend, route: dict[str, Any], options: Mapping[str, Any]) -> list[str] | None:
    """What a pre-imported child server imports for `route` with the backend `options` (the backend's module first), or
    None: a fresh interpreter."""
    return [type(backend).__module__, *backend.preload] if backend.fork_safe(route, options) else None


def make_job(ctx: Context, route: dict[str, Any], out_dir: Path, **pairing: Any) -> J.Job:
    """The child's job for building and measuring `route` of the study `ctx`.

    `pairing` sets the job's role, baseline and incumbent (see `tuner.job.Job`);
    without it the route is timed alone.
    """
    spec = ctx.spec
    return J.Job(
        backend=spec.backend.name,
        route=route,
        model_path=str(spec.model.path),
        input_shapes={k: list(v) for k, v in spec.model.inputs.items()},
        options=spec.backend.options,
        work_dir=str(ctx.work_dir),
        out_dir=str(out_dir),
        feeds_path=str(ctx.feeds_path),
        reference_path=str(ctx.reference_path),
        metric=spec.accuracy.metric,
        tolerance=spec.accuracy.tolerance,
        atol=spec.accuracy.atol,
        rtol=spec.accuracy.rtol,
        outputs={k: v.plain() for k, v in spec.accuracy.outputs.items()},
        gate_samples=spec.data.gate_samples,
        timeout_s=spec.run.trial_timeout_s,
        lock_wait_s=spec.run.trial_timeout_s,  # a lock held that long is held by a stuck process
        objective=spec.objective,
        shapes=ctx.shape_sets,
        build_holds_cores=ctx.backend.build_uses_host_cores(spec.backend.options),
        preload=preload(ctx.backend, route, spec.backend.options),
        **pairing,
    )
