"""Validation inputs: feeds read from an .npz file or made by a seeded generator, and their hash."""

from __future__ import annotations

import hashlib
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tuner.errors import TunerError
from tuner.files import atomic_path

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


def check_data_file(path: Path, model: ModelSpec, samples: int, constants: frozenset[str] = frozenset()) -> None:
    """Raise TunerError unless `path` holds an array for every model input not in `constants`, shaped
    like the input with at least `samples` batches along its batch axis; a scalar input takes a 1-D
    array (one value per sample) or a 0-D array (one value for all)."""
    arrays = _open(path)
    for name, shape in model.inputs.items():
        if name in constants:
            continue
        if name not in arrays:
            raise TunerError(f"{path.name} has no array {name!r} (it has {', '.join(arrays) or 'none'})")
        a = arrays[name]
        axis = model.batch_axis(name)
        if axis is None:
            if a.ndim > 1:
                raise TunerError(
                    f"array {name!r} has shape {list(a.shape)}; the input is a scalar: give a 1-D array (one value "
                    "per sample) or a 0-D array (one value for all)"
                )
            if a.ndim == 1 and a.shape[0] < samples:
                raise TunerError(
                    f"array {name!r} has {a.shape[0]} values; data.samples={samples} needs one per sample (or a 0-D "
                    "array for all)"
                )
        else:
            expected = [str(d) for d in shape]
            expected[axis] = "N"
            if a.ndim != len(shape) or any(a.shape[k] != d for k, d in enumerate(shape) if k != axis):
                raise TunerError(
                    f"array {name!r} has shape {list(a.shape)}; expected [{', '.join(expected)}] (samples along axis "
                    f"{axis})"
                )
            need = samples * shape[axis]
            if a.shape[axis] < need:
                raise TunerError(
                    f"array {name!r} has {a.shape[axis]} samples along axis {axis}; data.samples={samples} at batch "
                    f"{shape[axis]} needs {need}"
                )
        if np.dtype(a.dtype) != np.dtype(model.dtypes[name]):
            raise TunerError(f"array {name!r} is {a.dtype}; the model's input is {model.dtypes[name]}")


def load_feeds(spec: Spec, inputs: Mapping[str, Sequence[int]] | None = None) -> list[Feed]:
    """The study's validation feeds: `data.samples` feeds, each one batch of the model's input shapes (or of
    `inputs`, one of `[[objective.shapes]]`).

    Per input: the study file's constant, else the data file's batch i along the input's batch axis,
    else values from the seeded generator (the input's own range, else data.low/data.high). At a shape
    of `[[objective.shapes]]` the data file is used only when its arrays fit that shape for every sample
    (`check_data_file`); else every non-constant input comes from the generator.
    """
    from dataclasses import replace

    from tuner.spec.model import InputData

    model, data = spec.model, spec.data
    file = data.file
    if inputs is not None:
        model = replace(model, inputs={k: tuple(v) for k, v in inputs.items()})
        if file is not None:
            try:
                check_data_file(file, model, data.samples, constants=frozenset(data.inputs))
            except TunerError:
                file = None
    arrays = _open(file) if file is not None else {}
    rng = np.random.default_rng(data.seed)
    feeds = []
    for i in range(data.samples):
        feed = {}
        for name, shape in model.inputs.items():
            dtype = np.dtype(model.dtypes[name])
            given = data.inputs.get(name, InputData())
            if given.value is not None:
                feed[name] = np.full(shape, given.value, dtype=dtype)
            elif file is not None:
                feed[name] = _batch(arrays[name], model.batch_axis(name), shape, i)
            else:
                low = data.low if given.low is None else given.low
                high = data.high if given.high is None else given.high
                feed[name] = _generate(rng, dtype, shape, low, high)
        feeds.append(feed)
    return feeds


def _batch(array: np.ndarray, axis: int | None, shape: tuple[int, ...], i: int) -> np.ndarray:
    """Sample i of a data-file array: batch i along `axis`, or a scalar's i-th (or only) value."""
    if axis is None:  # (np.ascontiguousarray would make a 0-D array 1-D)
        return np.array(array if array.ndim == 0 else array[i])
    b = shape[axis]
    return np.ascontiguousarray(np.take(array, range(i * b, (i + 1) * b), axis=axis))


def _generate(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...], low: float, high: float) -> np.ndarray:
    """Seeded values of `dtype`: uniform in [low, high) for floats, integers in [low, high), bools."""
    if np.issubdtype(dtype, np.floating):
        return np.asarray(rng.uniform(low, high, size=shape)).astype(dtype)
    if dtype == np.bool_:
        return np.asarray(rng.integers(0, 2, size=shape)).astype(dtype)
    return np.asarray(rng.integers(int(low), max(int(high), int(low) + 1), size=shape)).astype(dtype)


def feeds_hash(feeds: list[Feed]) -> str:
    """A content hash of the feeds (names, dtypes, shapes and bytes)."""
    h = hashlib.sha256()
    for feed in feeds:
        for name in sorted(feed):
            a = np.asarray(feed[name], order="C")  # (np.ascontiguousarray would hash a 0-D array as 1-D)
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


def save_groups(path: Path, groups: Mapping[str, Mapping[str, np.ndarray]]) -> None:
    """Write named groups of arrays to an .npz (array X of group g is stored as `g/X`), atomically."""
    with atomic_path(path) as tmp:
        np.savez(tmp, **{f"{g}/{k}": v for g, arrays in groups.items() for k, v in arrays.items()})


def read_groups(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """Read groups written by `save_groups` (in file order)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    with np.load(path, allow_pickle=False) as npz:
        for key in npz.files:
            group, _, name = key.partition("/")
            out.setdefault(group, {})[name] = npz[key]
    return out


def save_feeds(path: Path, feeds: Sequence[Mapping[str, np.ndarray]]) -> None:
    """Write feeds (or per-feed outputs) to an .npz: feed i's array X is stored as `i/X`."""
    save_groups(path, {str(i): f for i, f in enumerate(feeds)})


def read_feeds(path: Path) -> list[Feed]:
    """Read feeds written by `save_feeds`, in order."""
    groups = read_groups(path)
    return [groups[i] for i in sorted(groups, key=int)]
