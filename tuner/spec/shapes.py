"""`[[objective.shapes]]`: the input shapes a deployment serves, each with a weight, checked against the model.

Each entry gives `inputs.NAME = [dims]` for some of the model's inputs (the others keep their `[model]`
shape) and a `weight` > 0 (default 1). A shape must have the input's rank and may change only the
dimensions the model leaves dynamic. The result is what `ObjectiveSpec.shapes` holds: one
`{"inputs": {name: [dims]}, "weight": w}` per entry, every input named, in the file's order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from tuner.spec.model import ModelSpec

SHAPE_KEYS = ("inputs", "weight")


class Failing(Protocol):
    """What reports a study-file error (`tuner.spec.load._Reader.fail`)."""

    def fail(self, field: str, expected: str) -> Exception: ...


def shape_label(inputs: Mapping[str, Sequence[int]]) -> str:
    """A shape in words, for a message: "images 8x3x224x224" (every input, in order)."""
    return ", ".join(f"{name} {'x'.join(map(str, dims)) or 'scalar'}" for name, dims in inputs.items())


def read_shapes(r: Failing, entries: Any, model: ModelSpec) -> tuple[dict[str, Any], ...]:
    """The checked `[[objective.shapes]]` entries (a SpecError through `r` for the first problem)."""
    field = "objective.shapes"
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise r.fail(field, "expected one or more [[objective.shapes]] tables with inputs.NAME = [...] and weight")
    out = []
    for i, entry in enumerate(entries):
        at = f"{field}[{i}]"
        unknown = sorted(set(entry) - set(SHAPE_KEYS))
        if unknown:
            raise r.fail(f"{at}.{unknown[0]}", f"unknown field; expected one of {', '.join(SHAPE_KEYS)}")
        out.append({"inputs": _inputs(r, at, entry.get("inputs"), model), "weight": _weight(r, at, entry)})
    seen = [o["inputs"] for o in out]
    for i, inputs in enumerate(seen):
        if inputs in seen[:i]:
            raise r.fail(f"{field}[{i}].inputs", f"the same shapes as objective.shapes[{seen.index(inputs)}]")
    return tuple(out)


def _weight(r: Failing, at: str, entry: dict[str, Any]) -> float:
    weight = entry.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
        raise r.fail(f"{at}.weight", f"expected a number > 0, got {weight!r}")
    return float(weight)


def _inputs(r: Failing, at: str, given: Any, model: ModelSpec) -> dict[str, list[int]]:
    if not isinstance(given, dict) or not given:
        raise r.fail(f"{at}.inputs", "expected inputs.NAME = [dims] for at least one model input")
    out = {name: list(shape) for name, shape in model.inputs.items()}
    for name, shape in given.items():
        field = f"{at}.inputs.{name}"
        if name not in model.inputs:
            raise r.fail(field, f"the model has no such input; its inputs are {', '.join(model.inputs)}")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape
        ):
            raise r.fail(field, "expected a list of positive integers")
        dims = model.dims.get(name)
        rank = len(dims) if dims is not None else len(model.inputs[name])
        if len(shape) != rank:
            raise r.fail(field, f"{shape} has rank {len(shape)}; the model's input has rank {rank}")
        fixed = [k for k, d in enumerate(dims or ()) if d is not None and d != shape[k]]
        if fixed:
            k = fixed[0]
            raise r.fail(field, f"dimension {k} is fixed at {dims[k]} by the model; {shape} changes it")  # type: ignore[index]
        out[name] = shape
    return out
