"""The replay space: the recorded space, with conditions and invalid combinations read from the data.

Conditions (`when`) of the recorded backend are code and cannot be stored, but a landscape that holds
every route of its space implies them: a knob is active after a partial route exactly when some
recorded route extends that partial route with the knob.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tuner.backends.replay.landscape import Landscape
from tuner.space import Param, SearchSpace
from tuner.space.params import Value


def replay_space(landscape: Landscape) -> SearchSpace:
    """The landscape's search space (same names, choices, defaults and order as recorded)."""
    routes = [p.route for p in landscape.points]
    params = tuple(
        Param(
            d["name"], tuple(d["choices"]), d["default"], "recorded knob", when=_recorded_condition(d["name"], routes)
        )
        for d in landscape.space_params()
    )
    invalid = {p.key: p.invalid for p in landscape.points if p.invalid}

    def check(route: Mapping[str, Value]) -> str | None:
        p = landscape.point(route)
        if p is None:
            return "route not in the landscape"
        return invalid.get(p.key)

    return SearchSpace(params, invalid=check)


def _recorded_condition(name: str, routes: list[dict[str, Value]]) -> Callable[[Mapping[str, Value]], bool] | None:
    """Active iff some recorded route that has `name` agrees with the knobs chosen so far."""
    having = [r for r in routes if name in r]
    if len(having) == len(routes):
        return None

    def when(chosen: Mapping[str, Value]) -> bool:
        return any(all(r.get(k) == v for k, v in chosen.items()) for r in having)

    return when
