"""The landscape file: every route of a study measured with a real backend (compressed JSON).

A landscape holds, per route, the outcome of each recording round (failure class, latency statistics
and raw samples) and the engine's outputs for each validation feed, so a replay computes accuracy
for real against the study's reference, under any tolerance. Identical output sets are stored once.
Arrays are JSON objects {dtype, shape, b64}; the file is gzip-compressed JSON.

A landscape may hold a reduced record of its large outputs (`meta["reduction"]`, a `Reduction`; the recorder's
`--reduce-outputs`): every floating-point array of the reference and of the routes' outputs above a size keeps only
its top k entries along the last axis per position (`TopK`: {dtype, shape, top_k: {indices, values}}), everything
else zero, and is reconstructed dense when read (`Landscape.reference` at load, `outputs_for` and `output_set` on
demand). Such a file is format `route-tuner-landscape/2`; one without reduced arrays stays `/1` (both load). The
recorder checks at record time that the study's accuracy verdicts do not change (`meta["reduction"]["faithfulness"]`).
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from tuner import job as J
from tuner.errors import TunerError
from tuner.files import atomic_path
from tuner.measure.inputs import feeds_hash
from tuner.measure.timing import summarize
from tuner.space import Route, route_hash

FORMAT = "route-tuner-landscape/1"  # every array stored dense
FORMAT_REDUCED = "route-tuner-landscape/2"  # /1 plus `TopK` arrays: written only when a file holds one
Outputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class Reduction:
    """Which arrays a landscape stores reduced: floating-point ones of more than `above_bytes` whose last axis is
    longer than `top_k` keep their `top_k` largest entries per position, the values as `values`."""

    top_k: int
    above_bytes: int
    values: str  # a float dtype: float16 or float32

    def applies(self, a: np.ndarray) -> bool:
        """Whether `a` is stored reduced."""
        return a.dtype.kind == "f" and a.ndim >= 1 and a.shape[-1] > self.top_k and a.nbytes > self.above_bytes

    def plain(self) -> dict[str, Any]:
        """As stored in a landscape's meta."""
        return {"top_k": self.top_k, "above_bytes": self.above_bytes, "values": self.values}

    @classmethod
    def of_meta(cls, meta: Mapping[str, Any]) -> Reduction | None:
        """The reduction a landscape's meta names, None for a landscape stored in full."""
        d = meta.get("reduction")
        return cls(int(d["top_k"]), int(d["above_bytes"]), str(d["values"])) if d else None


@dataclass(frozen=True, eq=False)
class TopK:
    """A reduced array: the `top_k` largest entries along the last axis of each position (their indices and
    values), everything else zero; `dense()` reconstructs it with the original dtype and shape."""

    dtype: str
    shape: tuple[int, ...]
    indices: np.ndarray  # [..., k], int16 where the last axis allows, else int32; ascending per position
    values: np.ndarray  # [..., k]

    @classmethod
    def of(cls, a: np.ndarray, reduction: Reduction) -> TopK:
        """`a` reduced to its top `reduction.top_k` entries per position."""
        a = np.asarray(a)
        k = reduction.top_k
        top = np.sort(np.argpartition(a, a.shape[-1] - k, axis=-1)[..., -k:], axis=-1)
        index = np.int16 if a.shape[-1] <= np.iinfo(np.int16).max + 1 else np.int32
        values = np.take_along_axis(a, top, axis=-1).astype(reduction.values)
        return cls(str(a.dtype), tuple(a.shape), top.astype(index), values)

    def dense(self) -> np.ndarray:
        """The array with the kept entries in place and zero elsewhere."""
        out = np.zeros(self.shape, dtype=self.dtype)
        np.put_along_axis(out, self.indices.astype(np.intp), self.values.astype(self.dtype), axis=-1)
        return out


Stored = dict[str, np.ndarray | TopK]  # one feed's outputs as a landscape holds them


def reduce_outputs(o: Mapping[str, Any], reduction: Reduction | None) -> Stored:
    """One feed's outputs with every array `reduction` applies to reduced (as they are without a reduction)."""
    return {
        name: TopK.of(a, reduction) if reduction and isinstance(a, np.ndarray) and reduction.applies(a) else a
        for name, a in o.items()
    }


def dense_outputs(o: Mapping[str, Any]) -> Outputs:
    """One feed's outputs with every reduced array reconstructed."""
    return {name: a.dense() if isinstance(a, TopK) else a for name, a in o.items()}


def encode_array(a: np.ndarray) -> dict[str, Any]:
    """An array as a JSON-able dict."""
    a = np.asarray(a, order="C")  # keeps a scalar 0-D
    return {"dtype": str(a.dtype), "shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode("ascii")}


def decode_array(d: Mapping[str, Any]) -> np.ndarray:
    """The array of `encode_array`."""
    return np.frombuffer(base64.b64decode(d["b64"]), dtype=np.dtype(d["dtype"])).reshape(d["shape"])


def feed_key(feed: Mapping[str, np.ndarray]) -> str:
    """A content hash of one feed (names, dtypes, shapes, bytes): how a replay finds its outputs."""
    return feeds_hash([dict(feed)])[:32]


def outputs_key(outputs: list[Outputs]) -> str:
    """A content hash of one engine's outputs over all feeds (equal outputs are stored once)."""
    return feeds_hash([dict(o) for o in outputs])[:32]


@dataclass(frozen=True)
class Round:
    """One recording round of one route: how it ended and, if timed, its latency samples (ms).

    A round timed paired with the default route's engine (ABBA blocks in one process) also has the
    paired `speedup` (default / this route) and the default engine's samples of that measurement;
    `loadavg` is the host's 1-minute load average before and after the measurement.
    """

    status: str
    phase: str = ""
    message: str = ""
    build_s: float | None = None
    samples_ms: tuple[float, ...] = ()
    speedup: float | None = None
    baseline_samples_ms: tuple[float, ...] = ()
    loadavg: tuple[float, float] | None = None

    @property
    def timed(self) -> bool:
        """Whether this round produced latency samples."""
        return bool(self.samples_ms)


@dataclass(frozen=True)
class Point:
    """One route of the landscape."""

    route: Route
    rounds: tuple[Round, ...] = ()
    invalid: str | None = None  # the space's known-invalid reason; such routes are never built
    outputs: str | None = None  # key into Landscape.outputs

    @property
    def key(self) -> str:
        return route_hash(self.route)


@dataclass
class Landscape:
    """A recorded landscape (see the module docstring); `meta` holds study, environment and space."""

    meta: dict[str, Any]
    points: list[Point]
    feeds: list[str]  # feed_key of each validation feed, in order
    reference: list[Outputs]  # the study's fp32 reference outputs, per feed (dense; reduced when saved, see above)
    outputs: dict[str, list[Stored]] = field(default_factory=dict)  # reduced arrays stay reduced: use `output_set`

    def __post_init__(self) -> None:
        self.reference = [dense_outputs(o) for o in self.reference]
        self._by_key = {p.key: p for p in self.points}
        self._feed_index = {k: i for i, k in enumerate(self.feeds)}
        self._true: dict[tuple[str, str], float | None] = {}
        self._levels: dict[tuple[str, str], list[float]] = {}
        self._default: list[Point | None] = []

    def point(self, route: Mapping[str, Any]) -> Point | None:
        """The point recorded for `route`, if any."""
        return self._by_key.get(route_hash(route))

    def outputs_for(self, point: Point, feed: Mapping[str, np.ndarray]) -> Outputs:
        """The outputs `point`'s engine produced for `feed` (KeyError if either was not recorded)."""
        if point.outputs is None:
            raise KeyError(f"no outputs recorded for route {point.key}")
        index = self._feed_index.get(feed_key(feed))
        if index is None:
            raise KeyError("this feed was not part of the recording (use the recording's data file and seed)")
        return dense_outputs(self.outputs[point.outputs][index])

    def output_set(self, key: str) -> list[Outputs]:
        """The output set `key` of `outputs`, per feed, with reduced arrays reconstructed."""
        return [dense_outputs(o) for o in self.outputs[key]]

    @property
    def reduction(self) -> Reduction | None:
        """How the large outputs are stored reduced (None: in full)."""
        return Reduction.of_meta(self.meta)

    def space_params(self) -> list[dict[str, Any]]:
        """The recorded space: [{name, choices, default}] in sampling order."""
        return list(self.meta["space"])

    def default_point(self) -> Point | None:
        """The point of the recorded space's default route: the one route whose every knob is at its default."""
        if not self._default:
            defaults = {d["name"]: d["default"] for d in self.space_params()}
            self._default.append(
                next((p for p in self.points if all(defaults.get(k) == v for k, v in p.route.items())), None)
            )
        return self._default[0]

    def levels(self, point: Point, statistic: str = "median") -> list[float]:
        """Each timed round's latency level (ms): the default route's true level over the round's paired
        speedup where the round was timed paired with the default, else the statistic of its own samples."""
        if (point.key, statistic) not in self._levels:
            base = self.default_point()
            base_ms = self.true_ms(base, statistic) if base is not None and base is not point else None
            self._levels[point.key, statistic] = [
                base_ms / r.speedup if r.speedup and base_ms else summarize(r.samples_ms).get(statistic)
                for r in point.rounds
                if r.status == J.OK and r.timed
            ]
        return list(self._levels[point.key, statistic])

    def true_ms(self, point: Point, statistic: str = "median") -> float | None:
        """The route's true latency: the median of its rounds' levels (None when no round was timed)."""
        if (point.key, statistic) not in self._true:
            levels = self.levels(point, statistic)
            self._true[point.key, statistic] = float(np.median(levels)) if levels else None
        return self._true[point.key, statistic]

    def paired(self) -> bool:
        """Whether the routes were timed paired with the default route (every timed non-default round has a speedup)."""
        base = self.default_point()
        rounds = [r for p in self.points if p is not base for r in p.rounds if r.timed]
        return bool(rounds) and all(r.speedup for r in rounds)

    def on_gpu(self) -> bool:
        """Whether the recording timed a GPU (its latencies are GPU-timed, with the GPU's timing defaults)."""
        options = self.meta.get("backend", {}).get("options", {})
        return str(options.get("device", "")).startswith("cuda") or str(options.get("provider", "")) == "cuda"

    def with_feeds(self, feeds: list[str]) -> Landscape:
        """This landscape answering the feeds keyed `feeds` (in the recorded order) instead of the recorded ones."""
        if len(feeds) != len(self.feeds):
            raise ValueError(f"{len(feeds)} feeds for a landscape recorded with {len(self.feeds)}")
        return Landscape(self.meta, self.points, list(feeds), self.reference, self.outputs)

    # -- file I/O ------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The whole landscape as JSON-able data (every array the reduction applies to reduced)."""
        r = self.reduction
        reference = [_enc_outputs(reduce_outputs(o, r)) for o in self.reference]
        outputs = {k: [_enc_outputs(reduce_outputs(o, r)) for o in v] for k, v in self.outputs.items()}
        reduced = any("top_k" in a for o in [*reference, *(o for v in outputs.values() for o in v)] for a in o.values())
        return {
            "format": FORMAT_REDUCED if reduced else FORMAT,
            **self.meta,
            "feeds": self.feeds,
            "reference": reference,
            "outputs": outputs,
            "points": [_enc_point(p) for p in self.points],
        }

    def save(self, path: Path) -> None:
        """Write `path` (.json.gz) atomically."""
        with atomic_path(path) as tmp, gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as f:
            json.dump(self.to_json(), f, separators=(",", ":"))


def load_landscape(path: Path) -> Landscape:
    """Read a landscape file (TunerError if it is missing or not one)."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as exc:
        raise TunerError(f"landscape {path}: not found") from exc
    return _load(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@cache
def _load(path: str, mtime_ns: int, size: int) -> Landscape:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError, EOFError) as exc:
        raise TunerError(f"landscape {path}: not a gzip-compressed JSON file ({type(exc).__name__})") from exc
    if doc.get("format") not in (FORMAT, FORMAT_REDUCED):
        raise TunerError(f"landscape {path}: format {doc.get('format')!r}, expected {FORMAT!r} or {FORMAT_REDUCED!r}")
    body = {"format", "feeds", "reference", "outputs", "points"}
    return Landscape(
        meta={k: v for k, v in doc.items() if k not in body},
        points=[_dec_point(p) for p in doc["points"]],
        feeds=list(doc["feeds"]),
        reference=[_dec_outputs(o) for o in doc["reference"]],
        outputs={k: [_dec_outputs(o) for o in v] for k, v in doc["outputs"].items()},
    )


def _enc_outputs(o: Stored) -> dict[str, Any]:
    return {name: _enc_topk(a) if isinstance(a, TopK) else encode_array(a) for name, a in o.items()}


def _dec_outputs(o: Mapping[str, Any]) -> Stored:
    return {name: _dec_topk(a) if "top_k" in a else decode_array(a) for name, a in o.items()}


def _enc_topk(a: TopK) -> dict[str, Any]:
    return {
        "dtype": a.dtype,
        "shape": list(a.shape),
        "top_k": {"indices": encode_array(a.indices), "values": encode_array(a.values)},
    }


def _dec_topk(d: Mapping[str, Any]) -> TopK:
    top = d["top_k"]
    return TopK(str(d["dtype"]), tuple(d["shape"]), decode_array(top["indices"]), decode_array(top["values"]))


def _enc_point(p: Point) -> dict[str, Any]:
    doc: dict[str, Any] = {"route": p.route, "rounds": [_enc_round(r) for r in p.rounds]}
    if p.invalid is not None:
        doc["invalid"] = p.invalid
    if p.outputs is not None:
        doc["outputs"] = p.outputs
    return doc


def _enc_round(r: Round) -> dict[str, Any]:
    doc: dict[str, Any] = {"status": r.status, "phase": r.phase}
    if r.message:
        doc["message"] = r.message
    if r.build_s is not None:
        doc["build_s"] = round(r.build_s, 4)
    if r.samples_ms:
        doc["samples_ms"] = [round(s, 4) for s in r.samples_ms]
    if r.speedup is not None:
        doc["speedup"] = round(r.speedup, 6)
    if r.baseline_samples_ms:
        doc["baseline_samples_ms"] = [round(s, 4) for s in r.baseline_samples_ms]
    if r.loadavg is not None:
        doc["loadavg"] = [round(v, 2) for v in r.loadavg]
    return doc


def _dec_point(d: Mapping[str, Any]) -> Point:
    rounds = tuple(
        Round(
            r["status"],
            r.get("phase", ""),
            r.get("message", ""),
            r.get("build_s"),
            tuple(r.get("samples_ms", ())),
            r.get("speedup"),
            tuple(r.get("baseline_samples_ms", ())),
            tuple(r["loadavg"]) if r.get("loadavg") else None,
        )
        for r in d.get("rounds", ())
    )
    return Point(dict(d["route"]), rounds, d.get("invalid"), d.get("outputs"))
