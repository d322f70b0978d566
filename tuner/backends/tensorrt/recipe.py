"""A TensorRT build as data: the builder-config calls `build` made, recorded as it made them, for the export.

`build` hands `configure` and `gpt_route` a `RecordingConfig` around the real `IBuilderConfig`: every
property set and method call goes through to the config and is kept as plain JSON (an enum member
as `{"enum": "BuilderFlag.TF32"}`, a tactic-source mask as the names of its sources). The trial
stores the recipe (`build_info["builder"]`), so `tuner.backends.tensorrt.export` writes the trtexec
line and the Python build script of exactly the calls the measured engine was built with, on a
machine without TensorRT.
"""

from __future__ import annotations

from typing import Any

Call = list[Any]  # ["set", property, value] or ["call", method, [arguments]]


def plain(value: Any) -> Any:
    """A config argument as JSON: an enum member as {"enum": "Owner.MEMBER"}, anything else as it is."""
    name = getattr(value, "name", None)
    if isinstance(name, str) and not isinstance(value, bool | str) and type(value).__name__ not in ("int", "float"):
        return {"enum": f"{type(value).__name__}.{name}"}
    return value


def enum_name(value: Any) -> str | None:
    """The member name of a recorded enum ("TF32" of {"enum": "BuilderFlag.TF32"}), None for any other value."""
    return value["enum"].rpartition(".")[2] if isinstance(value, dict) and "enum" in value else None


class RecordingConfig:
    """An IBuilderConfig that records every property set and method call on its way to the real one."""

    def __init__(self, config: Any, trt: Any) -> None:
        self.__dict__.update(_config=config, _trt=trt, calls=[])

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._config, name)
        if not callable(value):
            return value

        def recorded(*args: Any) -> Any:
            shown = [self._sources(args[0])] if name == "set_tactic_sources" else [plain(a) for a in args]
            self.calls.append(["call", name, shown])
            return value(*args)

        return recorded

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._config, name, value)
        self.calls.append(["set", name, plain(value)])

    def _sources(self, mask: int) -> dict[str, list[str]]:
        members = getattr(self._trt.TacticSource, "__members__", {})
        return {"tactic_sources": [name for name, member in members.items() if mask >> int(member) & 1]}
