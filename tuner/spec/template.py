"""A first study file for a model (`tuner init`): what the model says, filled in; what it cannot say, marked.

The file runs as written: the inputs' shapes come from the model (a dynamic dimension set to 1, with a
comment), the data from a given `.npz` or the seeded generator (integer inputs get a small range),
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
    data_samples: int | None = None,
    precision_note: str = "",
) -> str:
    """The commented study file for `model`, to be written at `out` (paths relative to its folder)."""
    samples = data_samples or SAMPLES
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
        lines += ["", f"[model.inputs.{key(t.name)}]", *_shape_lines(t)]
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


def _shape_lines(t: Tensor) -> list[str]:
    shape = [1 if d is None else d for d in t.dims]
    dynamic = [i for i, d in enumerate(t.dims) if d is None]
    note = f"   # {t.dtype}; the model's {_dims(t.dims)}" if t.dims else f"   # {t.dtype}, a scalar"
    if dynamic:
        note += f": dynamic dimension(s) {', '.join(map(str, dynamic))} set to 1 ({REVIEW})"
    return [f"shape = {value(shape)}{note}"]


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
