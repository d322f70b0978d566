"""ONNX Runtime's native reproduction of a trial: the model file, `session.json` and `run_onnxruntime.py`.

`session.json` holds the session the route was timed with, by ONNX Runtime's own names, from the same
mapping the timed sessions are opened from (`session.session_settings`); `run_onnxruntime.py` is
`standalone.py`, the code that opens them.
"""

from __future__ import annotations

import json
from pathlib import Path

from tuner.backends.base import Deployment, ExportRequest
from tuner.backends.onnxruntime.session import AS_IS, AT_LOAD, graph_level, session_settings

MODEL = "engine.onnx"
SCRIPT = "run_onnxruntime.py"


def deployment(request: ExportRequest) -> Deployment:
    """engine.onnx, session.json (the measured session) and the script that runs it."""
    route, info = request.route, request.build_info
    at_load = info.get("graph_optimization") == AT_LOAD
    level = graph_level(route) if at_load else AS_IS
    settings = {
        "model": MODEL,
        **session_settings(route, level),
        "inputs": {k: dict(v) for k, v in request.inputs.items()},
    }
    version = request.backend_version.split()[0] if request.backend_version else ""
    package = "onnxruntime-gpu" if "CUDAExecutionProvider" in settings["providers"] else "onnxruntime"
    pin = f"{package}=={version}" if version else package
    notes = []
    if at_load:
        notes.append(
            f"{MODEL} is the route's precision variant; ONNX Runtime optimises it when the session opens "
            f"({level}), because the file it optimised offline did not load again: "
            f"{info.get('offline_file_refused', '')}"
        )
    elif graph_level(route) == "ORT_ENABLE_ALL":
        notes.append(
            f"{MODEL} was optimised offline at ORT_ENABLE_ALL and is loaded with optimisation off (ORT_DISABLE_ALL). "
            "ONNX Runtime says a file optimised at that level may hold optimisations for the machine it was made on "
            "(NCHWc layouts): run it on the same kind of CPU, or rebuild it there."
        )
    run = (
        f"```python\nimport json\nfrom run_onnxruntime import open_session\n\n"
        f'session = open_session("{MODEL}", json.load(open("session.json")))  # the measured session\n'
        f"outputs = session.run(None, {{...}})\n```\n\n"
        f"or `python3 {SCRIPT} --data INPUTS.npz` (arrays keyed by input name, samples along each input's batch axis), "
        "which prints one JSON line with the median latency and the outputs' shapes."
    )
    return Deployment(
        artifact_name=MODEL,
        files={
            "session.json": json.dumps(settings, indent=2) + "\n",
            SCRIPT: Path(__file__).with_name("standalone.py").read_text(),
        },
        about={
            "session.json": "the session the route was timed with, by ONNX Runtime's names: session options, config "
            "entries, providers and their options; and the model's inputs",
            SCRIPT: "opens that session (only onnxruntime and numpy needed) and runs inputs from an .npz: "
            "the median latency and the outputs' shapes as one JSON line",
        },
        executables=(SCRIPT,),
        commands=[f'python3 {SCRIPT} "$@"'],
        needs=f"python3 with {pin} and numpy (pip install {pin} numpy)",
        run=run,
        notes=notes,
    )
