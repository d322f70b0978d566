"""Validation inputs: feeds read from an .npz file or made by a seeded generator, and their hash."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tuner.errors import TunerError

if TYPE_CHECKING:
    from tuner.spec import ModelSpec, Spec

Feed = dict[str, np.ndarray]


def _open(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise TunerError(f"file not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise TunerError(f"{path.name} is not a readable .npz file of arrays ({type(exc).__name__})") from exc


def check_data_file(path: Path, model: ModelSpec, samples: int) -> None:
    """Raise TunerError unless `path` holds, for every model input, [N, *shape[1:]] arrays with N >= needed."""
    arrays = _open(path)
    for name, shape in model.inputs.items():
        if name not in arrays:
            raise TunerError(f"{path.name} has no array {name!r} (it has {', '.join(arrays) or 'none'})")
        a = arrays[name]
        need = samples * shape[0]
        if a.ndim != len(shape) or tuple(a.shape[1:]) != tuple(shape[1:]):
            raise TunerError(f"array {name!r} has shape {list(a.shape)}; expected [N, {', '.join(map(str, shape[1:]))}] (samples first)")
        if a.shape[0] < need:
            raise TunerError(f"array {name!r} has {a.shape[0]} samples; data.samples={samples} at batch {shape[0]} needs {need}")
        if np.dtype(a.dtype) != np.dtype(model.dtypes[name]):
            raise TunerError(f"array {name!r} is {a.dtype}; the model's input is {model.dtypes[name]}")


def load_feeds(spec: Spec) -> list[Feed]:
    """The study's validation feeds: `data.samples` feeds, each one batch of the model's input shapes."""
    model, data = spec.model, spec.data
    if data.file is not None:
        arrays = _open(data.file)
        feeds = []
        for i in range(data.samples):
            feed = {}
            for name, shape in model.inputs.items():
                b = shape[0]
                feed[name] = np.ascontiguousarray(arrays[name][i * b : (i + 1) * b])
            feeds.append(feed)
        return feeds
    rng = np.random.default_rng(data.seed)
    feeds = []
    for _ in range(data.samples):
        feed = {}
        for name, shape in model.inputs.items():
            dtype = np.dtype(model.dtypes[name])
            if np.issubdtype(dtype, np.floating):
                feed[name] = rng.uniform(data.low, data.high, size=shape).astype(dtype)
            elif dtype == np.bool_:
                feed[name] = rng.integers(0, 2, size=shape).astype(dtype)
            else:
                feed[name] = rng.integers(int(data.low), max(int(data.high), int(data.low) + 1), size=shape).astype(dtype)
        feeds.append(feed)
    return feeds


def feeds_hash(feeds: list[Feed]) -> str:
    """A content hash of the feeds (names, dtypes, shapes and bytes)."""
    h = hashlib.sha256()
    for feed in feeds:
        for name in sorted(feed):
            a = np.ascontiguousarray(feed[name])
            h.update(f"{name}|{a.dtype}|{a.shape}|".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def file_hash(path: Path) -> str:
    """sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_feeds(path: Path, feeds: list[Feed]) -> None:
    """Write feeds to an .npz (feed i's input X is stored as `i/X`), atomically."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
    np.savez(tmp, **{f"{i}/{k}": v for i, f in enumerate(feeds) for k, v in f.items()})
    tmp.replace(path)


def read_feeds(path: Path) -> list[Feed]:
    """Read feeds written by `save_feeds`."""
    out: dict[int, Feed] = {}
    with np.load(path, allow_pickle=False) as npz:
        for key in npz.files:
            i, _, name = key.partition("/")
            out.setdefault(int(i), {})[name] = npz[key]
    return [out[i] for i in sorted(out)]
