"""`tuner probe`: which backends can run on this machine, with their versions, the GPU and its limits."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from tuner.backends import backend_names, get_backend
from tuner.backends.tensorrt.gpu import gpu_fingerprint
from tuner.cli.common import JsonOpt, console
from tuner.errors import MissingLibrary, TunerError

BackendOpt = Annotated[
    str | None,
    typer.Option(
        "--backend", help="Probe only this backend; exit 2 if it cannot run here (3: a library it needs is missing)."
    ),
]


def probe_backend(name: str) -> tuple[dict[str, Any], TunerError | None]:
    """{'available': bool, 'version'|'reason': str, ...capabilities} for one backend, and why it is unavailable."""
    try:
        backend = get_backend(name)
        return {"available": True, "version": backend.version(), **backend.capabilities()}, None
    except TunerError as exc:
        return {"available": False, "reason": str(exc)}, exc


def probe(backend: BackendOpt = None, as_json: JsonOpt = False) -> None:
    """Print the backends available here (version, GPT knobs, runtime support) and the GPU."""
    names = [backend] if backend else backend_names()
    probed = {name: probe_backend(name) for name in names}
    found = {name: facts for name, (facts, _) in probed.items()}
    gpu = gpu_fingerprint()
    if as_json:
        console.print_json(json.dumps({"gpu": gpu, "backends": found}))
    else:
        console.print(
            f"GPU: {', '.join(f'{k} {v}' for k, v in gpu.items()) if gpu else 'none found (no nvidia-smi answer)'}",
            highlight=False,
        )
        for name, facts in found.items():
            state = facts.get("version") if facts["available"] else f"unavailable: {facts['reason']}"
            console.print(f"{name}: {state}", highlight=False, markup=False, soft_wrap=True)
            for key in ("gpt", "runtime"):
                if key in facts:
                    console.print(f"  {key}: {facts[key]}", highlight=False, markup=False, soft_wrap=True)
    problem = probed[backend][1] if backend else None
    if problem is not None:  # a missing library keeps its exit status (3)
        raise (MissingLibrary if isinstance(problem, MissingLibrary) else TunerError)(
            f"backend {backend} cannot run here: {problem}"
        )
