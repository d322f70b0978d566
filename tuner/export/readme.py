"""The export's README.md: the verdict, what the route changes in words, what was measured and where, how to run it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.backends.base import Deployment
from tuner.study.verdict import Estimate

FILES = {
    "README.md": "this file",
    "route.json": "the route, by the tuner's parameter names (`tuner build STUDY.toml --route route.json --out DIR` "
    "rebuilds it)",
    "best.json": "`tuner best --json` of the study, with what was exported",
    "reproduce.sh": "runs the engine natively from this directory (and says what it needs installed)",
}


@dataclass(frozen=True)
class Measured:
    """What the study measured of the exported trial, for the README."""

    study: str
    backend: str
    trial: int
    reason: str
    verdict: str  # the study's verdict sentence
    statistic: str
    latency_ms: float | None  # as the trial's own uncontended timing measured it
    baseline_ms: float | None  # the default route's, timed beside it in that timing
    speedup: Estimate | None  # the study's own estimate for this trial (paired where measured so)
    confirmed: Mapping[str, Any] | None  # the confirmation's row for this trial (`confirmed_row`), if it measured it
    accuracy: Mapping[str, Any]  # metric, value, tolerance
    artifact_bytes: int | None
    peak_memory_mb: float | None
    memory_kind: str
    shapes: list[dict[str, Any]]  # each {"inputs", "weight"} and what was measured there (`measured_shapes`)
    share: Mapping[str, Any]  # the deployment's share of the machine: contention mode and cores (`machine_share`)
    environment: Mapping[str, Any] | None  # the worker's backend, version and device fingerprint


def _shapes(shapes: list[dict[str, Any]]) -> list[str]:
    lines = []
    for s in shapes:
        inputs = ", ".join(f"`{name}` {list(shape)}" for name, shape in s["inputs"].items())
        weight = f" (weight {s['weight']:g})" if len(shapes) > 1 else ""
        measured = ""
        if len(shapes) > 1 and s.get("speedup") is not None and s.get("ci"):
            measured = (
                f": default {s['default_ms']:.4g} ms, this route {s['route_ms']:.4g} ms, "
                f"{s['speedup']:.3f}x [{s['ci'][0]:.3f}-{s['ci'][1]:.3f}]"
            )
        lines.append(f"- {inputs}{weight}{measured}")
    return lines


def share_line(share: Mapping[str, Any]) -> str:
    """The deployment's share of the machine in words (what the timing assumed)."""
    cores = share.get("cores")
    where = f"pinned to {cores} core(s)" + (f" ({share['affinity']})" if share.get("affinity") else "")
    return (
        "timed with the cores to itself (contention exclusive)"
        if share.get("contention") == "exclusive"
        else "timed beside other work (contention shared: recorded, not acted on)"
    ) + (f", {where}" if cores else ", every core allowed")


def _machine(env: Mapping[str, Any] | None) -> str:
    if not env:
        return "not recorded with this trial (it was measured by an older route-tuner)"
    device = dict(env.get("device") or {})
    parts = [str(device.pop(k)) for k in ("gpu", "cpu") if k in device]
    if "cores" in device:
        parts.append(f"{device.pop('cores')} logical cores")
    rest = ", ".join(f"{k} {v}" for k, v in device.items() if not isinstance(v, dict | list) or v)
    return "; ".join(p for p in (", ".join(parts), f"{env.get('backend')} {env.get('version')}", rest) if p)


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} MiB"


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


def _confirmed_line(m: Measured) -> list[str]:
    """The confirmation's figures for the route, where it measured it: both medians and the speedup, one source."""
    c = m.confirmed
    if not c:
        return []
    return [
        f"- latency ({m.statistic}) in the confirmation: {c['median_ms']:.4g} ms, the default route "
        f"{c['default_median_ms']:.4g} ms (medians of its {c['processes']} paired processes); speedup "
        f"{c['speedup']:.2f}x (CI {c['low']:.2f}x-{c['high']:.2f}x)"
    ]


def readme(m: Measured, changes: list[str], deployment: Deployment, files: Mapping[str, str]) -> str:
    """The README.md text."""
    speedup = m.speedup.text() if m.speedup else "-"
    latency = "-" if m.latency_ms is None else f"{m.latency_ms:.4g} ms"
    baseline = "-" if m.baseline_ms is None else f"{m.baseline_ms:.4g} ms"
    memory = {"host-rss": "the process's RSS growth", "device": "device memory in use"}.get(m.memory_kind, "")
    acc = m.accuracy
    lines = [
        f"# {m.study}: trial {m.trial} ({m.backend})",
        "",
        m.verdict,
        "",
        f"Exported: {m.reason}.",
        "",
        "## What this route changes from the default route",
        "",
        *[f"- {c}" for c in changes],
        "",
        "## What was measured",
        "",
        *_confirmed_line(m),
        f"- latency ({m.statistic}) in the study: {latency}, the default route {baseline} beside it in the same "
        f"timing; the study's speedup estimate {speedup}",
        f"- accuracy: {acc.get('metric')} = {acc.get('value')} (tolerance {acc.get('tolerance')})",
        f"- engine file: {_size(m.artifact_bytes)}; peak memory while it loaded and ran: {_mib(m.peak_memory_mb)}"
        + (f" ({memory})" if memory else ""),
        "- input shapes"
        + (" (the speedup above is the weighted geometric mean over them)" if len(m.shapes) > 1 else "")
        + ":",
        *[f"  {line}" for line in _shapes(m.shapes)],
        f"- share of the machine: {share_line(m.share)}",
        f"- machine: {_machine(m.environment)}",
        "",
        "## Files",
        "",
        *[f"- `{name}`: {about}" for name, about in files.items()],
        "",
        "## Run it",
        "",
        "```sh",
        "sh reproduce.sh",
        "```",
        "",
        f"Needs: {deployment.needs or 'the tuner (no native reproduction)'}.",
        "",
    ]
    if deployment.run:
        lines += [deployment.run, ""]
    if deployment.notes:
        lines += ["## Notes", "", *[f"- {n}" for n in deployment.notes], ""]
    return "\n".join(lines)
