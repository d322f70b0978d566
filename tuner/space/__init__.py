"""A backend's search space: parameters, the conditions between them and known-invalid combinations."""

from tuner.space.params import Param, Route, SearchSpace, canonical_route, route_hash

__all__ = ["Param", "Route", "SearchSpace", "canonical_route", "route_hash"]
