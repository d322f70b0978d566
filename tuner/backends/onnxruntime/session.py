"""The ONNX Runtime session a route is timed with, in ONNX Runtime's own names (what an export's `session.json` holds).

`session_settings` is the one mapping from a route to session options; every session the tuner times
is opened from its result by `standalone.open_session`, the same function an export ships as
`run_onnxruntime.py`. The artifact says at which graph optimisation level it must be loaded
(`marked_level`): an offline-optimised file at `ORT_DISABLE_ALL`, a variant whose offline-optimised
file did not load (models with subgraphs) at the route's own level, marked in its metadata.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.space import Route

LEVELS = {
    "disabled": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}
AS_IS = "ORT_DISABLE_ALL"  # the level an offline-optimised file is loaded at: as it is
OFFLINE, AT_LOAD = "offline", "at-load"  # how an artifact's graph optimisation was applied (its `graph_optimization`)
LOAD_LEVEL_KEY = "route_tuner.graph_optimization_level"  # metadata of an artifact optimised at load instead

# Every session the tuner times stops its thread pools spinning when a run ends (ONNX Runtime's default keeps
# them spinning for a while). With the candidate and the baseline in one timing process, the idle engine's
# spinning pool otherwise ran beside the timed one on the same cores (bench/ort_spinning.py). Part of every
# route, default included; `tuner build` and the exported winner's session use it too.
SESSION_CONFIG = {"session.force_spinning_stop": "1"}


def graph_level(route: Route) -> str:
    """The route's ORT graph optimisation level, as ONNX Runtime names it (int8 static routes have their own knob)."""
    return LEVELS[str(route.get("int8_graph_level", route.get("graph_optimization_level", "all")))]


def session_settings(route: Route, load_level: str = AS_IS) -> dict[str, Any]:
    """The session options, config entries and providers `route` is timed with, by ONNX Runtime's names."""
    providers = PROVIDERS[str(route["provider"])]
    return {
        "session_options": {
            "graph_optimization_level": load_level,
            "execution_mode": "ORT_PARALLEL" if route["execution_mode"] == "parallel" else "ORT_SEQUENTIAL",
            "intra_op_num_threads": int(route["intra_op_threads"]),
            "inter_op_num_threads": int(route.get("inter_op_threads", 0)),
            "enable_cpu_mem_arena": bool(route["cpu_mem_arena"]),
            "enable_mem_pattern": bool(route["mem_pattern"]),
            "log_severity_level": 3,
        },
        "config_entries": dict(SESSION_CONFIG),
        "providers": list(providers),
        "provider_options": [{} for _ in providers],
    }


def marked_level(session: Any) -> str:
    """The graph optimisation level an opened artifact asks to be loaded at: its mark, else `ORT_DISABLE_ALL`.

    Read from the session's model metadata, so the runner opens a session once for an offline-optimised
    file (and a second time, at the marked level, for a variant optimised at load).
    """
    return str(session.get_modelmeta().custom_metadata_map.get(LOAD_LEVEL_KEY, AS_IS))


def mark_load_level(source: Path, out: Path, level: str) -> None:
    """Write `source` to `out` marked to be optimised at `level` when it is loaded."""
    import onnx

    model = onnx.load(str(source))
    kept = [p for p in model.metadata_props if p.key != LOAD_LEVEL_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=LOAD_LEVEL_KEY, value=level)
    onnx.save(model, str(out))
