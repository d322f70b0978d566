"""Record a landscape: every route of a study's space, measured with the real backend in isolated children.

    python -m bench.landscape.record studies/efficientnet_lite0_landscape.toml \
        -o bench/landscapes/efficientnet_lite0.json.gz --rounds 3

Each route runs through the same path as a trial (`make_job` + `run_isolated`, a fresh child per
route) with two changes: the backend is wrapped by `CaptureBackend` so the engine's outputs per feed
are kept, and the tolerance is infinite so every route that builds is timed and checked on all feeds
(the landscape serves any tolerance later). The timing is a trial's: exclusive on the device and
paired with the default route's engine (each round measures the default route first, alone, and
keeps its engine; every other route of the round is timed against it in ABBA blocks), so each round
stores the route's paired speedup and the host's load average before and after its measurement.
Rounds visit the other routes in a fresh random order each, so slow drifts of a shared machine spread
over all routes; routes that failed deterministically are not re-run. Progress is journaled under the study's work_dir,
so an interrupted recording resumes, and the landscape file is rewritten after every round.

With `--reduce-outputs` the file keeps a reduced record of large outputs (`REDUCE_OUTPUTS`: the top 8 entries per
position of float arrays over 256 KiB, see `tuner.backends.replay.landscape`); the journal's full outputs stay under
work_dir. Each output set is then judged with the study's accuracy (`tuner.measure.judge`, gate and all feeds) both
as recorded against the reference and as reconstructed against the reconstructed reference (what a replay computes),
and the landscape's `reduction.faithfulness` holds both values per output set, the largest difference and how many
routes' pass/fail verdicts under the study's tolerance the reduction would change.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from tuner import __version__
from tuner import job as J
from tuner.backends.replay.capture import OPTION, captured_path, read_captured
from tuner.backends.replay.landscape import (
    Landscape,
    Outputs,
    Point,
    Reduction,
    Round,
    Stored,
    dense_outputs,
    feed_key,
    outputs_key,
    reduce_outputs,
)
from tuner.errors import TunerError
from tuner.measure.accuracy import Tolerances
from tuner.measure.inputs import read_feeds, save_feeds
from tuner.measure.judge import Judge
from tuner.measure.reference import load_reference
from tuner.objective import fingerprint_part
from tuner.space import Route, SearchSpace, route_hash
from tuner.space.groups import knob_groups
from tuner.spec import load_spec
from tuner.study.setup import Context, seed_routes
from tuner.worker.isolate import run_isolated
from tuner.worker.jobs import make_job

CAPTURE = "tuner.backends.replay.capture:CaptureBackend"
NOT_RERUN = {J.BUILD_ERROR, J.RUNTIME_UNSUPPORTED, J.INVALID_ROUTE}  # deterministic failures
REDUCE_OUTPUTS = Reduction(top_k=8, above_bytes=1 << 18, values="float16")  # what --reduce-outputs stores


class Recorder:
    """Measures routes of one study into a journal (work_dir/landscape) and writes the landscape file."""

    def __init__(
        self,
        spec_path: Path,
        out: Path,
        rounds: int,
        sample: int | None = None,
        seed: int = 0,
        shard: tuple[int, int] | None = None,
        reduction: Reduction | None = None,
    ) -> None:
        self.ctx = Context(load_spec(spec_path), url="")
        self.reduction = reduction
        self._reduced: dict[str, list[Stored]] = {}  # output sets read and reduced, by key
        self._checks: dict[str, dict[str, Any]] = {}  # their faithfulness, by key
        self._reference: list[Outputs] | None = None  # the reference reconstructed from its reduced record
        self.out = out
        self.rounds = rounds
        self.seed = seed
        self.shard = shard
        space = self.ctx.space
        every = space.routes()
        self.total = len(every)
        default = space.default_route()  # in every subset: what all pair with
        if sample is not None and sample < self.total:
            keep = set(random.Random(seed).sample(range(self.total), sample))
            every = [r for i, r in enumerate(every) if i in keep or r == default]
        if shard is not None:
            k, n = shard
            every = [r for r, s in zip(every, _shards(space, every, n)) if s == k or r == default]
        self.routes = every
        self.dir = self.ctx.work_dir / "landscape"
        self.journal = self.dir / "journal.jsonl"

    # -- measuring ---------------------------------------------------------------------------

    def run(self, log: Callable[[str], None] = print) -> Landscape:
        """Measure every (route, round) not yet in the journal; write the landscape after each round."""
        self._check_journal()
        done = self._entries()
        feeds = [feed_key(f) for f in self.ctx.feeds]
        landscape = self.landscape(done)
        default = self.ctx.space.default_route()
        for rnd in range(self.rounds):
            order = [r for r in self.routes if r != default]
            random.Random(self.seed * 1000 + rnd).shuffle(order)
            todo = [r for r in [default, *order] if self._needs(route_hash(r), rnd, done)]
            baseline = self._baseline(rnd, done, feeds) if any(r != default for r in todo) else None
            t0 = time.monotonic()
            for i, route in enumerate(todo, 1):
                if route == default and route_hash(route) in done and rnd in done[route_hash(route)]:
                    continue  # measured by `_baseline` for this round
                entry = (
                    self._measure(route, rnd, feeds, baseline=baseline)
                    if route != default
                    else self._measure(route, rnd, feeds)
                )
                self._append(entry)
                done.setdefault(entry["key"], {})[rnd] = entry
                eta = (time.monotonic() - t0) / i * (len(todo) - i)
                log(
                    f"round {rnd + 1}/{self.rounds} {i}/{len(todo)} {entry['status']:<14} "
                    f"{_fmt(entry.get('median_ms'))} eta {eta / 60:.0f} min  {_short(route)}"
                )
            landscape = self.landscape(done)
            landscape.save(self.out)
            log(f"wrote {self.out} after round {rnd + 1}{_about(landscape, self.out)}")
        return landscape

    def _needs(self, key: str, rnd: int, done: dict[str, dict[int, dict[str, Any]]]) -> bool:
        have = done.get(key, {})
        if rnd in have:
            return False
        return not any(e["status"] in NOT_RERUN for e in have.values())

    def _baseline(
        self, rnd: int, done: dict[str, dict[int, dict[str, Any]]], feeds: list[str]
    ) -> dict[str, Any] | None:
        """The default route's engine this round's routes are paired with: measured (and journaled) once per round
        and kept under the journal's folder; None when the default route does not build."""
        default = self.ctx.space.default_route()
        kept = self.dir / "baseline" / f"round-{rnd}"
        engines = sorted(kept.glob("*")) if kept.exists() else []
        if not engines:
            entry = self._measure(default, rnd, feeds, keep=kept)
            if rnd not in done.get(entry["key"], {}):
                self._append(entry)
                done.setdefault(entry["key"], {})[rnd] = entry
            engines = sorted(kept.glob("*")) if kept.exists() else []
        if not engines:
            return None
        from tuner.measure.inputs import file_hash

        return {"trial": -1, "path": str(engines[0]), "sha256": file_hash(engines[0]), "route": default}

    def _measure(
        self, route: Route, rnd: int, feeds: list[str], baseline: dict[str, Any] | None = None, keep: Path | None = None
    ) -> dict[str, Any]:
        """One route measured in a child (paired with `baseline` when given; its engine kept in `keep` when given)."""
        key = route_hash(route)
        entry: dict[str, Any] = {
            "key": key,
            "round": rnd,
            "route": route,
            "t": round(time.time(), 1),
            "load1": os.getloadavg()[0],
        }
        reason = self.ctx.space.check(route)
        if reason:
            return {**entry, "status": J.INVALID_ROUTE, "phase": "", "message": reason}
        trial_dir = self.dir / "trial"
        shutil.rmtree(trial_dir, ignore_errors=True)
        spec = self.ctx.spec
        pairing: dict[str, Any] = {"baseline": baseline} if baseline else {"role": "baseline"}
        job = replace(
            make_job(self.ctx, route, trial_dir / "out", **pairing),
            backend=CAPTURE,
            options={**spec.backend.options, OPTION: spec.backend.name},
            tolerance=math.inf,
        )
        res = run_isolated(job, trial_dir)
        entry.update(
            status=res.status,
            phase=res.phase,
            message=res.message[:500],
            build_s=res.build_s,
            samples_ms=[round(s, 4) for s in res.samples_ms],
            accuracy=_finite(res.accuracy),
        )
        if res.paired.get("paired"):
            entry.update(speedup=res.paired["speedup"], ci=res.paired.get("ci"), stop=res.paired.get("stop"))
        info = res.timing_info
        if "loadavg_before" in info:
            entry["loadavg"] = [info["loadavg_before"][0], info["loadavg_after"][0]]
        if keep is not None and res.status == J.OK and res.artifact_path and Path(res.artifact_path).is_file():
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy2(res.artifact_path, keep / Path(res.artifact_path).name)
        if res.latency:
            entry["median_ms"] = res.latency["median"]
        captured = captured_path(self.ctx.work_dir, route)
        if res.status == J.OK and captured.exists():
            outputs = _ordered(read_captured(captured), feeds)
            okey = outputs_key(outputs)
            path = self.dir / "outputs" / f"{okey}.npz"
            if not path.exists():
                save_feeds(path, outputs)
            entry["outputs"] = okey
        shutil.rmtree(trial_dir, ignore_errors=True)
        return entry

    # -- journal -----------------------------------------------------------------------------

    def _header(self) -> dict[str, Any]:
        c = self.ctx
        return {
            "model": c.model_sha,
            "data": c.data_sha,
            "space": c.space.fingerprint(),
            "routes": len(self.routes),
            "metric": c.spec.accuracy.metric,
            "timing": fingerprint_part(c.spec.objective),
            "pairing": "default-first",
            **({"shard": f"{self.shard[0]}/{self.shard[1]}"} if self.shard else {}),
        }

    def _check_journal(self) -> None:
        header = self._header()
        if self.journal.exists():
            first = json.loads(self.journal.read_text().splitlines()[0])
            if first.get("header") != header:
                raise TunerError(f"{self.journal} was recorded with other settings; delete it to start over")
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self.journal.write_text(json.dumps({"header": header}) + "\n")

    def merge(self, shards: list[Path]) -> int:
        """Take the measurements of shard recordings (their `landscape` folders, recorded with `--shard` in copies
        of this study's folder, each pinned to its own cores) into this journal; how many were taken."""
        self._check_journal()
        done, taken = self._entries(), 0
        mine = {k: v for k, v in self._header().items() if k != "routes"}
        for folder in shards:
            lines = (folder / "journal.jsonl").read_text().splitlines()
            theirs = {k: v for k, v in json.loads(lines[0])["header"].items() if k not in ("routes", "shard")}
            if theirs != mine:
                raise TunerError(f"{folder / 'journal.jsonl'} was recorded with other settings than {self.journal}")
            for line in filter(str.strip, lines[1:]):
                e = json.loads(line)
                if e["round"] not in done.get(e["key"], {}):
                    self._append(e)
                    done.setdefault(e["key"], {})[e["round"]] = e
                    taken += 1
            for path in (folder / "outputs").glob("*.npz"):
                target = self.dir / "outputs" / path.name
                if not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, target)
        return taken

    def _append(self, entry: dict[str, Any]) -> None:
        with open(self.journal, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    def _entries(self) -> dict[str, dict[int, dict[str, Any]]]:
        done: dict[str, dict[int, dict[str, Any]]] = {}
        for line in self.journal.read_text().splitlines()[1:]:
            if line.strip():
                e = json.loads(line)
                done.setdefault(e["key"], {})[e["round"]] = e
        return done

    # -- the landscape file ------------------------------------------------------------------

    def landscape(self, done: dict[str, dict[int, dict[str, Any]]]) -> Landscape:
        """The landscape of what the journal holds so far."""
        points, outputs, mismatches = [], {}, 0
        reference = load_reference(self.ctx.reference_path)
        for route in self.routes:
            entries = [done[route_hash(route)][r] for r in sorted(done.get(route_hash(route), {}))]
            invalid = next((e["message"] for e in entries if e["status"] == J.INVALID_ROUTE), None)
            rounds = tuple(
                Round(
                    e["status"],
                    e["phase"],
                    e.get("message", ""),
                    e.get("build_s"),
                    tuple(e.get("samples_ms", ())),
                    e.get("speedup"),
                    (),
                    tuple(e["loadavg"]) if e.get("loadavg") else None,
                )
                for e in entries
                if e["status"] != J.INVALID_ROUTE
            )
            keys = [e["outputs"] for e in entries if e.get("outputs")]
            mismatches += len(set(keys)) > 1
            okey = keys[0] if keys else None
            if okey and okey not in outputs:
                outputs[okey] = self._output_set(okey, reference)
            points.append(Point(route, rounds, invalid, okey))
        meta = self._meta(done, mismatches)
        if self.reduction is not None:
            meta["reduction"] = {**self.reduction.plain(), "faithfulness": self._faithfulness(points)}
        return Landscape(meta, points, [feed_key(f) for f in self.ctx.feeds], reference, outputs)

    def _output_set(self, key: str, reference: list[Outputs]) -> list[Stored]:
        """Output set `key` as the landscape stores it: in full, or reduced (and checked) once per recorder."""
        if self.reduction is None:
            return read_feeds(self.dir / "outputs" / f"{key}.npz")
        if key not in self._reduced:
            full = read_feeds(self.dir / "outputs" / f"{key}.npz")
            stored = [reduce_outputs(o, self.reduction) for o in full]
            self._checks[key] = self._check(full, [dense_outputs(o) for o in stored], reference)
            self._reduced[key] = stored
        return self._reduced[key]

    def _check(self, full: list[Outputs], rebuilt: list[Outputs], reference: list[Outputs]) -> dict[str, Any]:
        """The study's accuracy [gate feeds, all feeds] of an output set as recorded against the reference (`full`),
        reconstructed from its reduced record against the reconstructed reference (`reduced`: what the landscape's
        own reference gives, in `Truth` and the search benchmark) and against the reference in full
        (`reduced_vs_full_reference`: a study on the replay backend computes its own), the largest difference from
        `full` and whether either changes the pass/fail verdict under the study's tolerance."""
        acc, gate = self.ctx.spec.accuracy, self.ctx.spec.data.gate_samples
        judge = Judge(acc.metric, acc.tolerance, Tolerances(acc.atol, acc.rtol), dict(acc.outputs))
        if self._reference is None:
            self._reference = [dense_outputs(reduce_outputs(o, self.reduction)) for o in reference]

        def values(outs: list[Outputs], against: list[Outputs]) -> list[float]:
            return [judge.worst(judge.values(o, r)) for o, r in ((outs[:gate], against[:gate]), (outs, against))]

        def passes(v: list[float]) -> bool:
            return max(v) <= acc.tolerance

        before = values(full, reference)
        after = {"reduced": values(rebuilt, self._reference), "reduced_vs_full_reference": values(rebuilt, reference)}
        differences = [0.0 if a == b else abs(a - b) for v in after.values() for a, b in zip(before, v)]
        return {
            "full": [_finite(v) for v in before],
            **{k: [_finite(x) for x in v] for k, v in after.items()},
            "difference": _finite(max(differences)),
            "verdict_changed": any(passes(v) != passes(before) for v in after.values()),
        }

    def _faithfulness(self, points: list[Point]) -> dict[str, Any]:
        """The reduction's effect on the study's accuracy over the routes with outputs (see `_check`)."""
        routes = [p for p in points if p.outputs is not None]
        checks = {k: self._checks[k] for k in sorted({p.outputs for p in routes if p.outputs})}
        differences = [c["difference"] for c in checks.values()]
        return {
            "metric": self.ctx.spec.accuracy.metric,
            "tolerance": self.ctx.spec.accuracy.tolerance,
            "values": "[gate feeds, all feeds]",
            "routes": len(routes),
            "output_sets": len(checks),
            "verdicts_changed": sum(bool(checks[p.outputs]["verdict_changed"]) for p in routes if p.outputs),
            "largest_difference": None if None in differences else max(differences, default=0.0),
            "per_output_set": checks,
        }

    def _complete_rounds(self, done: dict[str, dict[int, dict[str, Any]]]) -> int:
        return sum(all(not self._needs(route_hash(r), rnd, done) for r in self.routes) for rnd in range(self.rounds))

    def _meta(self, done: dict[str, dict[int, dict[str, Any]]], mismatches: int) -> dict[str, Any]:
        c, spec = self.ctx, self.ctx.spec
        b = c.backend
        return {
            "study": {"name": spec.study, "file": spec.path.name, "text": spec.path.read_text()},
            "backend": {"name": b.name, "version": b.version(), "options": spec.backend.options},
            "environment": {
                "device": b.device(),
                "python": platform.python_version(),
                "platform": platform.platform(),
                "tuner": __version__,
                "numpy": np.__version__,
                "niceness": os.nice(0),
                **_contention(done),
                "written": _utc(time.time()),
            },
            "model": {
                "file": spec.model.path.name,
                "sha256": c.model_sha,
                "inputs": {k: list(v) for k, v in spec.model.inputs.items()},
            },
            "data": {"sha256": c.data_sha, "samples": spec.data.samples, "gate_samples": spec.data.gate_samples},
            "accuracy": {
                "metric": spec.accuracy.metric,
                "tolerance": spec.accuracy.tolerance,
                "atol": spec.accuracy.atol,
                "rtol": spec.accuracy.rtol,
            },
            "objective": fingerprint_part(spec.objective),
            "space": [{"name": p.name, "choices": list(p.choices), "default": p.default} for p in c.space.params],
            "seed_routes": seed_routes(b, c.model_info, c.space),
            "pairing": "each round: the default route alone, then every route paired with it",
            "enumeration": {
                "space_routes": self.total,
                "recorded_routes": len(self.routes),
                "subset_seed": self.seed if len(self.routes) < self.total else None,
                "rounds": self.rounds,
                "rounds_complete": self._complete_rounds(done),
                "measured": sum(len(v) for v in done.values()),
                "routes_with_differing_outputs": mismatches,
            },
        }


def _contention(done: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    """When the measurements were taken and the 1-minute load average at each (where journaled)."""
    entries = [e for rounds in done.values() for e in rounds.values() if "t" in e]
    if not entries:
        return {}
    loads = np.array([e["load1"] for e in entries])
    return {
        "measured_from": _utc(min(e["t"] for e in entries)),
        "measured_to": _utc(max(e["t"] for e in entries)),
        "loadavg_1min": {
            "min": round(float(loads.min()), 2),
            "median": round(float(np.median(loads)), 2),
            "max": round(float(loads.max()), 2),
            "measurements": len(entries),
        },
    }


def _about(landscape: Landscape, path: Path) -> str:
    """The file's size and, for a reduced record, what the reduction changed."""
    size = path.stat().st_size
    text = f" ({size / 1e6:.1f} MB)" if size >= 1e6 else f" ({size / 1e3:.0f} kB)"
    f = landscape.meta.get("reduction", {}).get("faithfulness")
    if f:
        text += (
            f"; reduced outputs: {f['verdicts_changed']} of {f['routes']} routes' verdicts changed, "
            f"largest accuracy difference {f['largest_difference']}"
        )
    return text


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _ordered(captured: dict[str, Outputs], feeds: list[str]) -> list[Outputs]:
    missing = [k for k in feeds if k not in captured]
    if missing:
        raise TunerError(f"the child recorded no outputs for {len(missing)} feed(s)")
    return [captured[k] for k in feeds]


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _fmt(ms: float | None) -> str:
    return f"{ms:8.3f} ms" if ms is not None else "       -   "


def _short(route: Route) -> str:
    return " ".join(f"{k}={v}" for k, v in route.items() if k != "provider")


def _shards(space: SearchSpace, routes: list[Route], n: int) -> list[int]:
    """Each route's shard of `n`: routes that share a precision variant (the `precision` knob's group and every knob the
    default route lacks: the sub-knobs, which the backend builds once and keeps under work_dir) go to one shard, the
    variants dealt out in turn, so no variant is built on two shards; by index when the space has no such knob."""
    group = next((g for g in knob_groups(space).groups if "precision" in g), None)
    if group is None:
        return [i % n for i in range(len(routes))]
    default = space.default_route()
    variant = [*group, *(p.name for p in space.params if p.name not in default and p.name not in group)]
    dealt: dict[tuple[Any, ...], int] = {}
    return [dealt.setdefault(tuple(r.get(k) for k in variant), len(dealt) % n) for r in routes]


def _shard(text: str) -> tuple[int, int]:
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit() and int(k) < int(n)):
        raise argparse.ArgumentTypeError(f"--shard: expected K/N with 0 <= K < N, got {text!r}")
    return int(k), int(n)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(prog="python -m bench.landscape.record", description=__doc__.split("\n\n")[0])
    p.add_argument("spec", type=Path, help="the study file whose (restricted) space is recorded")
    p.add_argument("-o", "--out", type=Path, required=True, help="the landscape file to write (.json.gz)")
    p.add_argument("--rounds", type=int, default=2, help="timing rounds per route (default 2)")
    p.add_argument("--sample", type=int, default=None, help="record a random subset of this many routes")
    p.add_argument("--seed", type=int, default=0, help="seed of the subset and of the visiting orders")
    p.add_argument(
        "--shard",
        type=_shard,
        default=None,
        help="K/N: record only shard K of N (a precision variant's routes share one)",
    )
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=[],
        help="take in these shard recordings' landscape folders and write the file (no measuring)",
    )
    r = REDUCE_OUTPUTS
    p.add_argument(
        "--reduce-outputs",
        action="store_true",
        help=f"store float outputs over {r.above_bytes} bytes as their top {r.top_k} entries per position "
        f"({r.values} values, the rest zero), checking that the study's accuracy verdicts stay",
    )
    args = p.parse_args(argv)
    try:
        reduction = REDUCE_OUTPUTS if args.reduce_outputs else None
        recorder = Recorder(args.spec, args.out, args.rounds, args.sample, args.seed, args.shard, reduction)
        if args.merge:  # take the shards' measurements in and write the landscape of what they hold
            print(f"took {recorder.merge(args.merge)} measurements from {len(args.merge)} shard(s)", flush=True)
            landscape = recorder.landscape(recorder._entries())
            landscape.save(args.out)
            print(f"wrote {args.out}{_about(landscape, args.out)}", flush=True)
        else:
            recorder.run(lambda s: print(s, flush=True))
    except TunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
