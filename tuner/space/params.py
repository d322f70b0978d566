"""Categorical parameters with conditions, composed into a search space that Optuna samples.

Every parameter is categorical (integers included): build routes are discrete choices, categorical
parameters keep GP and TPE samplers well behaved (no huge integer ranges),
and a value list is the natural way for a study file to restrict a parameter.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

Value = bool | int | float | str
Route = dict[str, Value]


class Suggester(Protocol):
    """The part of `optuna.Trial` a search space needs."""

    def suggest_categorical(self, name: str, choices: Sequence[Value]) -> Value: ...


@dataclass(frozen=True)
class Param:
    """One build-route knob.

    `when` decides from the values chosen so far whether this knob applies at all (an inactive knob
    is neither sampled nor part of the route). `help` is shown by `tuner space`; `why`, where set,
    says why some values are not offered here (it ends the error for a restriction that names one).
    `threads`: the knob is a thread count (0: the runtime decides), bounded by `[objective] cores`.
    """

    name: str
    choices: tuple[Value, ...]
    default: Value
    help: str = ""
    when: Callable[[Mapping[str, Value]], bool] | None = None
    why: str = ""
    threads: bool = False

    def __post_init__(self) -> None:
        if self.default not in self.choices:
            raise ValueError(f"parameter {self.name}: default {self.default!r} not in {self.choices!r}")

    def active(self, chosen: Mapping[str, Value]) -> bool:
        """Whether this knob applies given the knobs chosen before it."""
        return self.when is None or self.when(chosen)


@dataclass(frozen=True)
class SearchSpace:
    """An ordered list of parameters plus an optional check for known-invalid combinations."""

    params: tuple[Param, ...]
    invalid: Callable[[Mapping[str, Value]], str | None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        names = [p.name for p in self.params]
        if len(names) != len(set(names)):
            raise ValueError(f"duplicate parameter names in {names}")

    def names(self) -> list[str]:
        """Parameter names in sampling order."""
        return [p.name for p in self.params]

    def param(self, name: str) -> Param:
        """The parameter called `name` (KeyError if there is none)."""
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def restrict(self, allowed: Mapping[str, Sequence[Value]]) -> SearchSpace:
        """A copy whose parameters only offer the `allowed` values (a one-value list fixes a knob).

        Raises KeyError for an unknown parameter and ValueError for a value the parameter lacks or a
        list that drops the default (the default route is every study's baseline).
        """
        unknown = sorted(set(allowed) - set(self.names()))
        if unknown:
            raise KeyError(", ".join(unknown))
        params = []
        for p in self.params:
            if p.name not in allowed:
                params.append(p)
                continue
            values = tuple(allowed[p.name])
            if not values:
                raise ValueError(f"{p.name}: needs at least one value")
            bad = [v for v in values if not _member(v, p.choices)]
            if bad:
                raise ValueError(f"{p.name}: {bad!r} not among {list(p.choices)!r}" + (f"; {p.why}" if p.why else ""))
            if not _member(p.default, values):
                raise ValueError(f"{p.name}: must keep the default {p.default!r} (the baseline route)")
            params.append(replace(p, choices=tuple(_normalise(v, p.choices) for v in values)))
        return replace(self, params=tuple(params))

    def within_cores(self, cores: int | None) -> SearchSpace:
        """A copy whose thread-count knobs offer no count above `cores` (None: unchanged)."""
        if cores is None:
            return self
        params = tuple(
            replace(
                p,
                choices=tuple(v for v in p.choices if not isinstance(v, int) or v <= cores),
                why=p.why or f"[objective] cores = {cores}: no more threads than the deployment's cores",
            )
            if p.threads
            else p
            for p in self.params
        )
        return replace(self, params=params)

    def default_route(self) -> Route:
        """The backend's default route: every active knob at its default."""
        route: Route = {}
        for p in self.params:
            if p.active(route):
                route[p.name] = p.default
        return route

    def suggest(self, trial: Suggester) -> Route:
        """Sample a route, knob by knob, skipping knobs whose condition is not met."""
        route: Route = {}
        for p in self.params:
            if p.active(route):
                route[p.name] = trial.suggest_categorical(p.name, list(p.choices))
        return route

    def complete(self, chosen: Mapping[str, Value]) -> Route:
        """The route with the `chosen` values and every other active knob at its default."""
        route: Route = {}
        for p in self.params:
            if p.active(route):
                route[p.name] = chosen.get(p.name, p.default)
        return route

    def contains(self, route: Mapping[str, Value]) -> bool:
        """Whether `route` is a route of this space: every active knob set to one of its choices, nothing else."""
        walked: Route = {}
        for p in self.params:
            if p.active(walked):
                if p.name not in route or not _member(route[p.name], p.choices):
                    return False
                walked[p.name] = route[p.name]
        return set(walked) == set(route)

    def check(self, route: Mapping[str, Value]) -> str | None:
        """Why `route` is known to be invalid, or None."""
        return self.invalid(route) if self.invalid else None

    def routes(self) -> list[Route]:
        """Every route of the space (conditions applied), in a fixed order; for small spaces only."""
        out: list[Route] = [{}]
        for p in self.params:
            grown: list[Route] = []
            for r in out:
                if p.active(r):
                    grown.extend({**r, p.name: v} for v in p.choices)
                else:
                    grown.append(r)
            out = grown
        return out

    def describe(self) -> dict[str, Any]:
        """A JSON-able description (names, choices, defaults); its hash identifies the space."""
        return {p.name: {"choices": list(p.choices), "default": p.default} for p in self.params}

    def fingerprint(self) -> str:
        """A short hash of `describe()`, stored with a study to refuse resuming on another space."""
        return hashlib.sha256(json.dumps(self.describe(), sort_keys=True).encode()).hexdigest()[:16]


def _member(value: Value, choices: Sequence[Value]) -> bool:
    return any(_same(value, c) for c in choices)


def _same(a: Value, b: Value) -> bool:
    return (
        type(a) is type(b)
        and a == b
        or (
            not isinstance(a, bool)
            and not isinstance(b, bool)
            and isinstance(a, int | float)
            and isinstance(b, int | float)
            and a == b
        )
    )


def _normalise(value: Value, choices: Sequence[Value]) -> Value:
    return next(c for c in choices if _same(value, c))


# One encoder for every call: `json.dumps` with options builds a new one each time (a local search keys its
# neighbourhoods' tens of thousands of routes by this)
_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def canonical_route(route: Mapping[str, Value]) -> str:
    """The route as canonical JSON (sorted keys): equal routes give equal strings."""
    return _CANONICAL_JSON.encode(dict(route))


def route_hash(route: Mapping[str, Value]) -> str:
    """A short content hash of the canonical route."""
    return hashlib.sha256(canonical_route(route).encode()).hexdigest()[:16]
