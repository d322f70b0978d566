"""Knob groups: a knob together with the sub-knobs it activates, flattened into one move of a local search.

A space's knobs have conditions between them (`Param.when`): `keep_fp32` exists only for an fp16
graph, the int8 knobs only for an int8 one, a transformer fusion's switches only when the fusion is
on. Changing `precision` alone to fp16 can only reach fp16 with the default `keep_fp32`; the route
that needs fp16 with `keep_fp32 = none` is two one-knob moves away, through a worse route. Grouping a
knob with the knobs it activates makes "precision fp16, nothing kept in fp32" one move.

Groups are read off the conditions: a knob active in the default route starts a group; a knob
inactive there joins the first group one of whose joint values activates it (else starts its own).
The distance between two routes is the number of groups whose joint values (inactive knobs
included, as absent) differ.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from tuner.space.params import Route, SearchSpace, Value

GROUP_VALUES_MAX = 4096  # joint values of one group enumerated; larger groups are sampled
ENUMERATE_UP_TO = 4096  # spaces with up to this many routes have their whole route list
NEIGHBOURS_MAX = 8192  # routes collected around a route of a larger space (see Groups.within)
JOINT_VALUES_KEPT = 4096  # (group, rest of a route) whose joint values `Groups.values` keeps


@dataclass(frozen=True)
class Groups:
    """The knob groups of a space, in sampling order (each a tuple of knob names, its root first)."""

    space: SearchSpace
    groups: tuple[tuple[str, ...], ...]
    # (group, the rest of a route) -> the routes with each of the group's joint values: `_varied`, asked again for
    # every route of a ring
    kept: dict[tuple[tuple[str, ...], tuple[tuple[str, Value], ...]], list[Route]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def of(self, route: Mapping[str, Value]) -> tuple[tuple[Value | None, ...], ...]:
        """The route as one joint value per group (None for a knob the route lacks)."""
        return tuple(tuple(route.get(name) for name in g) for g in self.groups)

    def distance(self, a: Mapping[str, Value], b: Mapping[str, Value]) -> int:
        """How many groups differ between routes `a` and `b`."""
        return sum(x != y for x, y in zip(self.of(a), self.of(b)))

    def values(self, route: Mapping[str, Value], group: Sequence[str]) -> list[Route]:
        """Every joint value of `group` (the group's active knobs) with the rest of `route` as it is."""
        return [{k: v for k, v in varied.items() if k in group} for varied in self._varied(route, group)]

    def _varied(self, route: Mapping[str, Value], group: Sequence[str]) -> list[Route]:
        """The whole routes `values` come from: the rest of `route` with each joint value of `group`, completed.

        They depend on the rest of `route` only, so they are kept by it (the routes of a ring share most).
        """
        key = (tuple(group), _key({k: v for k, v in route.items() if k not in group}))
        if key not in self.kept:
            if len(self.kept) >= JOINT_VALUES_KEPT:
                self.kept.clear()
            self.kept[key] = list(itertools.islice(_walk(self.space, route, set(group)), GROUP_VALUES_MAX))
        return self.kept[key]

    def moves(self, route: Mapping[str, Value], keep: frozenset[int] = frozenset()) -> Iterator[tuple[int, Route]]:
        """The routes one group move away from `route` (one group's joint value changed, the rest kept), each with
        the index of the group moved; the groups whose indices are in `keep` are not moved."""
        here = self.of(route)
        for i, group in enumerate(self.groups):
            if i in keep:
                continue
            for moved in self._varied(route, group):
                if tuple(moved.get(name) for name in group) != here[i]:
                    yield i, dict(moved)

    @cached_property
    def size(self) -> int:
        """How many routes the space has (counted up to ENUMERATE_UP_TO + 1)."""
        return sum(1 for _ in itertools.islice(_walk(self.space, {}, set(self.space.names())), ENUMERATE_UP_TO + 1))

    @cached_property
    def _every(self) -> list[tuple[Route, tuple[tuple[Value | None, ...], ...]]]:
        """Every route of a small space with its joint values."""
        return [(r, self.of(r)) for r in self.space.routes()]

    def within(self, route: Mapping[str, Value], radius: int, rng: np.random.Generator | None = None) -> list[Route]:
        """Every route within `radius` group moves of `route` (itself excluded): from the whole route list of a
        small space, else by repeated moves, at most NEIGHBOURS_MAX of them.

        In a large space the second ring alone holds millions of routes (one group with thousands of joint
        values), so each ring is grown from the previous ring's routes in random order (`rng`; in order
        without one), moving only groups a route has not moved yet, until NEIGHBOURS_MAX routes are collected.
        """
        if self.size <= ENUMERATE_UP_TO:
            here = self.of(route)
            return [r for r, joint in self._every if 0 < sum(x != y for x, y in zip(here, joint)) <= radius]
        seen = {_key(route)}
        found: list[Route] = []
        ring: list[tuple[Route, frozenset[int]]] = [(dict(route), frozenset())]
        for _ in range(radius):
            grown: list[tuple[Route, frozenset[int]]] = []
            for i in rng.permutation(len(ring)) if rng is not None else range(len(ring)):
                moved_route, moved = ring[i]
                for group, m in self.moves(moved_route, keep=moved):
                    if (key := _key(m)) not in seen:
                        seen.add(key)
                        grown.append((m, moved | {group}))
                if len(found) + len(grown) >= NEIGHBOURS_MAX:
                    return found + [r for r, _ in grown[: NEIGHBOURS_MAX - len(found)]]
            found += [r for r, _ in grown]
            ring = grown
        return found


@functools.lru_cache(maxsize=8)
def knob_groups(space: SearchSpace) -> Groups:
    """The space's knob groups (see the module docstring); kept for the last few spaces (a local search's sampler and
    its encoder ask for the same)."""
    default = space.default_route()
    groups: list[list[str]] = []
    for p in space.params:
        if p.name in default:
            groups.append([p.name])
            continue
        home = next(
            (
                g
                for g in groups
                if any(p.name in varied for varied in itertools.islice(_walk(space, default, set(g)), GROUP_VALUES_MAX))
            ),
            None,
        )
        if home is None:
            groups.append([p.name])
        else:
            home.append(p.name)
    return Groups(space, tuple(tuple(g) for g in groups))


def _walk(space: SearchSpace, route: Mapping[str, Value], free: set[str]) -> Iterator[Route]:
    """The routes with each joint value of the knobs in `free`, walking the space in order: each active knob in
    `free` at each of its values, every other active knob at its value in `route` (else its default), inactive
    knobs left out (each route as `space.complete` would complete it).

    Depth first (the space's order, a knob's values in their order) with a stack of its own rather than recursive
    generators, which would pass every route up through one frame per knob: this walk is most of the work of a
    local search's proposal."""
    params = space.params
    stack: list[tuple[int, Route]] = [(0, {})]
    while stack:
        start, chosen = stack.pop()  # `chosen` is this branch's own dict: set in place
        for i in range(start, len(params)):
            p = params[i]
            if not p.active(chosen):
                continue
            if p.name in free:
                stack.extend((i + 1, {**chosen, p.name: v}) for v in reversed(p.choices[1:]))
                chosen[p.name] = p.choices[0]
            else:
                chosen[p.name] = route.get(p.name, p.default)
        yield chosen


def _key(route: Mapping[str, Value]) -> tuple[tuple[str, Value], ...]:
    return tuple(sorted(route.items()))
