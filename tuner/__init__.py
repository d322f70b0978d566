"""Route Tuner: find the fastest compiled engine for an ONNX model within an accuracy tolerance.

from tuner import Study

verdict = Study.from_file("studies/efficientnet_lite0.toml").run(trials=3, confirm=False)
"""

from typing import Any

from tuner.version import __version__

__all__ = ["Study", "__version__"]


def __getattr__(name: str) -> Any:
    """`tuner.Study` on first use: `import tuner` stays cheap for the worker and trial processes."""
    if name == "Study":
        from tuner.api import Study

        return Study
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")
