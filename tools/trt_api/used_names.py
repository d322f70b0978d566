"""Every TensorRT name the backend source uses, found by a static scan, checked against name lists.

What counts as a use (the backend keeps to these conventions so the scan is complete):
* an attribute chain on the module variable `trt`: `trt.BuilderFlag.TF32` -> "BuilderFlag.TF32";
* an attribute of a variable (or `self.` attribute) whose name is a key of RECEIVERS:
  `config.build_route` -> "IBuilderConfig.build_route";
* a method defined in a class deriving from `trt.X`: `def step_complete` -> "IProgressMonitor.step_complete";
* the member-name tables of `space.py` / `run.py` reached with getattr (TABLES).
Names only 10.x has are listed in TRT10_ONLY; names only the GPT API (11.1+, RTX) has in GPT_ONLY.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

BACKEND = Path(__file__).resolve().parents[2] / "tuner" / "backends" / "tensorrt"
# Variable names that hold TensorRT objects in the backend, and their Python classes.
RECEIVERS = {
    "builder": "Builder", "network": "INetworkDefinition", "parser": "OnnxParser", "config": "IBuilderConfig",
    "profile": "IOptimizationProfile", "tensor": "ITensor", "error": "ParserError", "cache": "ITimingCache",
    "runtime": "Runtime", "engine": "ICudaEngine", "context": "IExecutionContext",
}
# Member-name tables reached with getattr: (module, table, owner, "keys" or "values").
TABLES = (("space", "TACTICS", "TacticSource", "values"), ("space", "LEGACY_TACTICS", "TacticSource", "values"),
          ("space", "TILING", "TilingOptimizationLevel", "values"), ("run", "DTYPES", "DataType", "keys"))
TRT10_ONLY = frozenset({
    "BuilderFlag.FP16", "BuilderFlag.BF16", "BuilderFlag.INT8", "BuilderFlag.FP8", "BuilderFlag.OBEY_PRECISION_CONSTRAINTS",
    "TacticSource.CUBLAS", "TacticSource.CUBLAS_LT", "TacticSource.CUDNN", "NetworkDefinitionCreationFlag.STRONGLY_TYPED",
})
GPT_ONLY = frozenset({"IBuilderConfig.build_route", "IBuilderConfig.all_build_routes"})


def _chain(node: ast.AST) -> list[str] | None:
    """['a', 'b', 'c'] for the expression a.b.c (None if it is not a plain name chain)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def scan(source: str) -> set[str]:
    """The TensorRT names one source file uses."""
    tree = ast.parse(source)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}  # only whole chains count
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in map(_chain, node.bases):
                if base and base[0] == "trt" and len(base) == 2:
                    used.update(f"{base[1]}.{f.name}" for f in node.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_"))
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        chain = _chain(node)
        if not chain:
            continue
        if chain[0] == "self" and len(chain) > 2:
            chain = chain[1:]
        names = [p for p in chain[1:] if not p.startswith("__")]
        if chain[0] == "trt" and names:
            used.add(".".join(names))
        elif chain[0] in RECEIVERS and names:
            used.add(f"{RECEIVERS[chain[0]]}.{names[0]}")
    return used


def used_names() -> set[str]:
    """Every TensorRT name the backend uses: the scan of its source files plus the getattr tables."""
    used: set[str] = set()
    for path in sorted(BACKEND.glob("*.py")):
        used |= scan(path.read_text())
    for module, table, owner, part in TABLES:
        values = getattr(importlib.import_module(f"tuner.backends.tensorrt.{module}"), table)
        members = values.values() if part == "values" and isinstance(values, dict) else values
        used.update(f"{owner}.{name}" for name in members)
    return used


def load_names(path: Path) -> tuple[set[str], dict[str, set[str]]]:
    """(all lines, member -> owners) of a name list written by extract_names.py."""
    lines = {line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")}
    owners: dict[str, set[str]] = {}
    for line in lines:
        if "." in line:
            owner, _, member = line.rpartition(".")
            owners.setdefault(member, set()).add(owner)
    return lines, owners


def missing(used: set[str], names: Path) -> list[str]:
    """The used names the list at `names` does not confirm.

    `Owner.member` is confirmed when that line is in the list; when the disassembly attributed the
    member to no class at all, the owner and the member as bare names suffice (the strict and the
    name-level check of docs/tensorrt-backend.md).
    """
    lines, owners = load_names(names)
    out = []
    for name in sorted(used):
        owner, _, member = name.rpartition(".")
        if not owner:
            ok = name in lines
        elif name in lines:
            ok = True
        else:
            ok = member not in owners and member in lines and owner.split(".")[0] in lines
        if not ok:
            out.append(name)
    return out
