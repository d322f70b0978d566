"""The Global Performance Tuner's knob database: knobs -> categorical parameters -> build-route string.

`IBuilderConfig.all_build_routes` (TensorRT 11.1+, enterprise) is JSON:
`{"tuner_version": "...", "tuner_options": [{"option": "-kgen:tiling", "allowed_values":
"-kgen:tiling=[0|1|2]", "default_value": "0", "help": "..."}, ...]}` (tensorrt.md §1.3).
A bounded knob (`[a|b|c]`) becomes the parameter `knob:<option>`; an unbounded one (`int32_t`, `=int`,
`...`) only when the study file lists values for it in `backend.options.gpt_knobs` (a list: a subset to
search; a scalar: a fixed value). The route string is every knob as `-name=value` in database order,
so the default route equals trtexec's `default_build_route`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner import job as J
from tuner.backends.base import BuildError
from tuner.backends.tensorrt.options import GPT_KNOBS, GPT_SELECT, GPT_SELECTIONS
from tuner.errors import TunerError
from tuner.space import Param
from tuner.space.params import Value

PREFIX = "knob:"
BRACKETS = re.compile(r"=\[([^\]]*)\]\s*$")


class RouteRejected(BuildError):
    """TensorRT did not take the build route (read back differently): nothing was built for it."""

    failure_class = J.ROUTE_REJECTED


@dataclass(frozen=True)
class Knob:
    """One compiler knob. `values` is None for an unbounded knob."""

    option: str
    values: tuple[str, ...] | None
    default: str
    help: str = ""


@dataclass(frozen=True)
class KnobDatabase:
    """The parsed `all_build_routes` JSON (empty when GPT is unavailable)."""

    tuner_version: str
    knobs: tuple[Knob, ...]

    def default_route(self) -> str:
        """Every knob at its default, in database order (trtexec's `default_build_route`)."""
        return " ".join(f"{k.option}={k.default}" for k in self.knobs)

    def knob(self, option: str) -> Knob:
        """The knob called `option` (with or without its leading dash)."""
        wanted = option if option.startswith("-") else f"-{option}"
        for k in self.knobs:
            if k.option == wanted:
                return k
        raise TunerError(
            f"backend.options.gpt_knobs: unknown knob {option!r} (tuner {self.tuner_version} has {len(self.knobs)} "
            "knobs)"
        )


EMPTY = KnobDatabase("", ())


def parse_knob_database(text: str) -> KnobDatabase:
    """Parse `all_build_routes`; an empty string means GPT is unavailable."""
    if not text.strip():
        return EMPTY
    try:
        data = json.loads(text)
        knobs = tuple(_knob(entry) for entry in data["tuner_options"])
        return KnobDatabase(str(data.get("tuner_version", "")), knobs)
    except (ValueError, KeyError, TypeError) as exc:
        raise TunerError(
            f"TensorRT's all_build_routes is not the expected knob-database JSON ({type(exc).__name__}: {exc})"
        ) from exc


def _knob(entry: Mapping[str, Any]) -> Knob:
    option = str(entry["option"])
    bounded = BRACKETS.search(str(entry.get("allowed_values", "")))
    values = tuple(v.strip() for v in bounded.group(1).split("|") if v.strip()) if bounded else None
    return Knob(option, values, str(entry.get("default_value", "")), str(entry.get("help", "")))


def knob_params(db: KnobDatabase, options: Mapping[str, Any]) -> list[Param]:
    """Categorical parameters for the knobs, per `options.gpt_knobs` and `options.gpt_select`.

    `gpt_select = "all"` (default) offers every bounded knob plus the listed ones; `"listed"` only
    the knobs named in `gpt_knobs`; `"off"` none. A listed list restricts a knob to those values (the
    default is always kept: it is the baseline); a listed scalar fixes it.
    """
    select = str(GPT_SELECT.get(options))
    if select not in GPT_SELECTIONS:
        raise TunerError(f"backend.options.gpt_select: expected all, listed or off, got {select!r}")
    listed = {db.knob(name).option: value for name, value in dict(GPT_KNOBS.get(options)).items()}
    if select == "off":
        return []
    params = []
    for knob in db.knobs:
        if knob.option in listed:
            params.append(_listed(knob, listed[knob.option]))
        elif select == "all" and knob.values:
            choices = knob.values if knob.default in knob.values else (knob.default, *knob.values)
            params.append(Param(PREFIX + knob.option, choices, knob.default, _help(knob)))
    return params


def _listed(knob: Knob, value: Any) -> Param:
    if isinstance(value, list):
        values = [str(v) for v in value]
        if knob.values is not None:
            bad = [v for v in values if v not in knob.values]
            if bad:
                raise TunerError(
                    f"backend.options.gpt_knobs: {knob.option} has no value(s) {bad}; allowed {list(knob.values)}"
                )
        choices = tuple(dict.fromkeys([knob.default, *values]))
        return Param(PREFIX + knob.option, choices, knob.default, _help(knob))
    fixed = str(value)
    if knob.values is not None and fixed not in knob.values:
        raise TunerError(
            f"backend.options.gpt_knobs: {knob.option} has no value {fixed!r}; allowed {list(knob.values)}"
        )
    return Param(PREFIX + knob.option, (fixed,), fixed, f"fixed by the study file; {_help(knob)}")


def _help(knob: Knob) -> str:
    return f"GPT knob {knob.option}" + (f": {knob.help}" if knob.help else "")


def compose_route(db: KnobDatabase, route: Mapping[str, Value]) -> str:
    """The build-route string for `route`: every knob, the route's value or the default."""
    return " ".join(f"{k.option}={route.get(PREFIX + k.option, k.default)}" for k in db.knobs)


def tokens(route: str) -> dict[str, str]:
    """`-name=value` tokens as a dict (order and spacing ignored)."""
    return dict(tok.split("=", 1) if "=" in tok else (tok, "") for tok in route.split())


def apply_route(config: Any, route: str) -> None:
    """Set `config.build_route` and read it back; RouteRejected if TensorRT did not take it.

    The 11.1 Python setter discards `setBuildRoute`'s bool (tensorrt.md §1.2), so reading back is the
    only way to see a rejected route.
    """
    config.build_route = route
    taken = str(config.build_route)
    if tokens(taken) != tokens(route):
        missing = sorted(set(tokens(route).items()) - set(tokens(taken).items()))
        raise RouteRejected(
            f"TensorRT did not take the build route: {len(missing)} token(s) differ, e.g. "
            f"{' '.join(f'{k}={v}' for k, v in missing[:3])}"
        )


def study_attrs(db: KnobDatabase) -> dict[str, Any]:
    """What a study records about the knob database it was created with."""
    return {
        "gpt_tuner_version": db.tuner_version or None,
        "gpt_default_build_route": db.default_route(),
        "gpt_knobs": len(db.knobs),
    }
