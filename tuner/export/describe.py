"""What a route changes from the default route, in words: each changed knob with its one-line description."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.space import SearchSpace


@dataclass(frozen=True)
class Change:
    """One knob whose value differs from the default route's (`default` None: the default route has no such knob)."""

    name: str
    about: str  # the knob's description, as `tuner space` shows it
    default: Any
    value: Any
    own_default: bool = False  # a knob the default route lacks, set to its own default

    def text(self) -> str:
        """`precision variant of the ONNX graph (precision): fp32 -> int8_static`."""
        was = "not used by the default route" if self.default is None else str(self.default)
        knob = f"{self.about} ({self.name})" if self.about else self.name
        return f"{knob}: {was} -> {self.value}" + (" (the knob's default)" if self.own_default else "")


def changes(
    route: Mapping[str, Any], default_route: Mapping[str, Any], space: SearchSpace | None = None
) -> list[Change]:
    """The knobs of `route` that differ from `default_route`, in the route's order, described by `space` where given.

    A knob the default route does not have (a conditional one, e.g. the ops kept in fp32 of an fp16
    graph) is a change too, whatever its value.
    """
    params = {p.name: p for p in space.params} if space is not None else {}
    return [
        Change(
            name,
            params[name].help if name in params else "",
            default_route.get(name),
            value,
            name not in default_route and name in params and params[name].default == value,
        )
        for name, value in route.items()
        if name not in default_route or default_route[name] != value
    ]


def change_lines(
    route: Mapping[str, Any], default_route: Mapping[str, Any], space: SearchSpace | None = None
) -> list[str]:
    """`changes` as text, one line each; a route equal to the default says so."""
    found = changes(route, default_route, space)
    return [c.text() for c in found] or ["nothing: this is the default route"]
