"""A first study file for a model (`tuner init`): what the model says, filled in; what it cannot say, marked.

The file runs as written: the inputs' shapes come from the model, a dynamic dimension from the given data
file's array, else set to 1 (the batch, and anything else unknown) or to 224 (an image's height and width),
with a comment; the data from a given `.npz` or the seeded generator (integer inputs get a small range),
the metric from the outputs (one 2-D output: class logits, `top1_mismatch`; an embedding: `cosine`;
anything else: `outside_tol`), with its tolerance marked "review this".
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.spec.toml import key, value

REVIEW = "review this"
BUDGET = 20
SAMPLES = 8  # generated samples (a data file gives its own count)
IMAGE_SIDE = 224  # a dynamic image height or width without a data file: a common classifier's input
EMBEDDING_WORDS = ("embed", "pool", "feature", "hidden", "vector", "sentence")
INTEGER = ("int64", "int32", "int8", "uint8")


@dataclass(frozen=True)
class Tensor:
    """One model input or output: its name, numpy dtype name and dimensions (None: dynamic)."""

    name: str
    dtype: str
    dims: list[int | None]


@dataclass(frozen=True)
class Metric:
    """The suggested accuracy metric, its starting tolerance, and why."""

    name: str
    tolerance: float
    why: str


def study_name(model: Path) -> str:
    """A study name from the model's file name (letters, digits, '.', '_', '-')."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", model.stem).strip("-.")[:100] or "study"


def suggest_metric(outputs: list[Tensor], samples: int) -> Metric:
    """One 2-D output: class logits (`top1_mismatch`); an embedding (`cosine`); else `outside_tol`."""
    floats = [t for t in outputs if t.dtype.startswith("float")]
    if len(floats) == 1 and len(outputs) == 1:
        out = floats[0]
        if any(word in out.name.lower() for word in EMBEDDING_WORDS) and len(out.dims) in (2, 3):
            return Metric("cosine", 0.01, f"output {out.name!r} looks like an embedding: the worst cosine distance")
        if len(out.dims) == 2:
            return Metric(
                "top1_mismatch",
                round(1.0 / samples, 6),
                f"output {out.name!r} is 2-D, class logits: the share of samples whose arg-max changes "
                f"(1/{samples}: one sample may flip)",
            )
    return Metric(
        "outside_tol", 0.01, "the share of output elements outside atol + rtol * |reference| (atol, rtol 1e-3)"
    )


def study_text(
    model: Path,
    out: Path,
    inputs: list[Tensor],
    outputs: list[Tensor],
    backend: str,
    data: Path | None = None,
    data_shapes: dict[str, tuple[int, ...]] | None = None,
    precision_note: str = "",
) -> str:
    """The commented study file for `model`, to be written at `out` (paths relative to its folder).

    `data_shapes`: the shapes of the arrays in the data file `data` (samples along axis 0), by name."""
    data_shapes = data_shapes or {}
    given = [data_shapes[t.name][0] for t in inputs if t.dims and t.name in data_shapes]
    samples = given[0] if given else 1 if data is not None else SAMPLES  # a data file of scalars: one sample
    metric = suggest_metric(outputs, samples)
    name = study_name(model)
    lines = [
        f"# A study of {model.name}, written by `tuner init`; every field is described in docs/study-file.md.",
        f'# Check the lines marked "{REVIEW}", then: tuner run {out.name}',
        "",
        "[study]",
        f"name = {value(name)}",
        '# storage = "postgresql://user@host/db"   # or --storage URL, or $TUNER_STORAGE; '
        f"without one: SQLite in .tuner/{name}/",
        "",
        "[model]",
        f"path = {value(_relative(model, out))}",
        "# outputs: " + ", ".join(f"{t.name} {t.dtype} {_dims(t.dims)}" for t in outputs),
    ]
    for t in inputs:
        array = data_shapes.get(t.name)
        lines += ["", f"[model.inputs.{key(t.name)}]", _shape_line(t, array, data.name if data else "")]
    lines += ["", "[data]", *_data_lines(inputs, out, data, samples)]
    lines += [
        "",
        "[accuracy]",
        f"# {metric.why}",
        f"metric = {value(metric.name)}",
        f"tolerance = {value(metric.tolerance)}   # {REVIEW}: how much may the tuned engine differ from fp32?",
        "",
        "[backend]",
        f"name = {value(backend)}",
        f"# space = {{ precision = [...] }}   # restrict the search; `tuner space {out.name}` lists it",
    ]
    if precision_note:
        lines.append(f"# {precision_note}")
    lines += [
        "",
        "[run]",
        f"budget = {BUDGET}   # the total number of trials (`tuner run --trials N` overrides it)",
        "workers = 1   # one worker keeps CPU timings honest on a shared machine",
        "",
    ]
    return "\n".join(lines)


def chosen_shape(
    t: Tensor, data_shape: tuple[int, ...] | None = None, data_name: str = "the data file"
) -> tuple[list[int], dict[str, list[int]]]:
    """The shape a study of input `t` runs at, and how each dynamic dimension got its value ({how: dimensions}).

    The batch (dimension 0) is 1; another dimension is the array's in data file `data_name` (`data_shape`,
    samples along axis 0) where one is given, else an image's height and width (a 4-D input of 1 or 3 channels)
    are `IMAGE_SIDE`, else 1."""
    shape: list[int] = []
    how: dict[str, list[int]] = {}
    for k, d in enumerate(t.dims):
        if d is not None:
            shape.append(d)
            continue
        if k > 0 and data_shape is not None and len(data_shape) == len(t.dims):
            value, why = data_shape[k], f"from {data_name}"
        elif k >= 2 and len(t.dims) == 4 and t.dims[1] in (1, 3):
            value, why = IMAGE_SIDE, f"set to {IMAGE_SIDE} (an image's height and width)"
        else:
            value, why = 1, "set to 1"
        shape.append(value)
        how.setdefault(why, []).append(k)
    return shape, how


def _shape_line(t: Tensor, data_shape: tuple[int, ...] | None, data_name: str) -> str:
    shape, how = chosen_shape(t, data_shape, data_name)
    note = f"   # {t.dtype}; the model's {_dims(t.dims)}" if t.dims else f"   # {t.dtype}, a scalar"
    if how:
        ways = "; ".join(f"{', '.join(map(str, dims))} {why}" for why, dims in how.items())
        note += f": dynamic dimension(s) {ways} ({REVIEW})"
    return f"shape = {value(shape)}{note}"


def _data_lines(inputs: list[Tensor], out: Path, data: Path | None, samples: int) -> list[str]:
    gate = min(2, samples)
    if data is not None:
        return [
            f"file = {value(_relative(data, out))}   # arrays keyed by input name, samples along axis 0",
            f"samples = {samples}",
            f"gate_samples = {gate}   # checked before timing: a quick accuracy gate",
        ]
    lines = [
        "# No data file: seeded random inputs drawn from [low, high). Real inputs judge accuracy better:",
        '# numpy.savez("val.npz", NAME=array, ...) with samples along axis 0, then file = "val.npz".',
        "seed = 0",
        f"samples = {samples}",
        f"gate_samples = {gate}   # checked before timing: a quick accuracy gate",
        "low = -1.0",
        "high = 1.0",
    ]
    for t in inputs:
        if t.dtype in INTEGER:
            lines += [
                "",
                f"[data.inputs.{key(t.name)}]   # an integer input: {REVIEW} (token ids below the vocabulary, indices "
                "below their dimension)",
                "low = 0",
                "high = 2",
            ]
        elif t.dtype == "bool":
            lines += ["", f"[data.inputs.{key(t.name)}]", f"value = true   # {REVIEW}"]
    return lines


def _dims(dims: list[int | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _relative(path: Path, out: Path) -> str:
    """`path` as the study file at `out` names it: relative to its folder."""
    return os.path.relpath(path.resolve(), out.resolve().parent)


def tensors(items: Any, dtypes: dict[int, str]) -> list[Tensor]:
    """ONNX value infos as `Tensor`s (element types outside `dtypes` are named by number)."""
    out = []
    for v in items:
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in t.shape.dim]
        out.append(Tensor(v.name, dtypes.get(t.elem_type, f"type{t.elem_type}"), dims))
    return out
