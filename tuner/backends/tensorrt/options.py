"""The TensorRT backend's declared `[backend.options]` (checked when the study file is loaded)."""

from __future__ import annotations

from tuner.backends.base import Option

TIMING_CACHE_POLICIES = ("fresh", "shared")
GPT_SELECTIONS = ("all", "listed", "off")

CUDA_GRAPH = Option("cuda_graph", bool, True, "run and time the engine through a captured CUDA graph")
TIMING_CACHE = Option(
    "timing_cache",
    str,
    "fresh",
    "'fresh': an empty timing cache per build (trials stay independent); "
    "'shared': one cache file per TensorRT version and GPU, reused",
    choices=TIMING_CACHE_POLICIES,
)
GPT_SELECT = Option(
    "gpt_select",
    str,
    "all",
    "GPT knobs searched: every bounded knob plus the listed ones, only the listed ones, or none",
    choices=GPT_SELECTIONS,
)
GPT_KNOBS = Option("gpt_knobs", dict, {}, "GPT knobs by name: a list of values to search, or one value to fix")
OPTIONS = (CUDA_GRAPH, TIMING_CACHE, GPT_SELECT, GPT_KNOBS)
