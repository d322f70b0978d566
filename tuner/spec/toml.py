"""Write study files: TOML values and tables (the standard library reads TOML but does not write it)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def key(name: str) -> str:
    """A TOML key: bare where it can be, else quoted."""
    return name if _BARE.match(name) else json.dumps(name)


def value(v: Any) -> str:
    """One TOML value: a boolean, a number, a string, a list or an inline table."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(v, list | tuple):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{key(str(k))} = {value(x)}" for k, x in v.items()) + " }" if v else "{}"
    raise TypeError(f"no TOML form for {type(v).__name__}: {v!r}")


def dumps(doc: Mapping[str, Mapping[str, Any]]) -> str:
    """A study file's text: one `[section]` per top-level table, nested tables inline."""
    lines: list[str] = []
    for section, table in doc.items():
        if not isinstance(table, Mapping):
            raise TypeError(f"[{section}]: expected a table, got {type(table).__name__}")
        lines.append(f"[{key(section)}]")
        lines.extend(f"{key(str(k))} = {value(v)}" for k, v in table.items())
        lines.append("")
    return "\n".join(lines)
