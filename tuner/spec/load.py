"""Read and fully validate a study file before anything touches a database.

Every error is a `SpecError` naming the file, the field and what is expected.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

from tuner.errors import MissingLibrary, SpecError, TunerError, require
from tuner.measure.accuracy import Tolerances
from tuner.measure.judge import Rule
from tuner.objective import settings as objective_settings
from tuner.objective import value_type
from tuner.spec.model import (
    DEFAULT_SAMPLER,
    DEFAULT_STARTUP_TRIALS,
    WARM_START_MODES,
    AccuracySpec,
    BackendSpec,
    DataSpec,
    InputData,
    ModelSpec,
    ObjectiveSpec,
    RunSpec,
    Spec,
)
from tuner.store.urls import STORAGE_ENV, normalize_url

SAMPLERS = ("local", "tpe", "random", "gp")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")

_SECTIONS: dict[str, set[str]] = {
    "study": {"name", "storage", "work_dir"},
    "model": {"path", "inputs"},
    "data": {"file", "seed", "samples", "gate_samples", "low", "high", "inputs"},
    "accuracy": {"metric", "tolerance", "atol", "rtol", "outputs"},
    "objective": {name for name, _, _ in objective_settings()},
    "backend": {"name", "space", "options"},
    "run": {
        "budget",
        "workers",
        "trial_timeout_s",
        "heartbeat_s",
        "grace_s",
        "max_attempts",
        "sampler",
        "seed",
        "startup_trials",
        "racing",
        "warm_start",
        "keep_best",
        "max_disk_mb",
        "mix_devices",
        "timeout_s",
    },
}


class _Reader:
    """Typed access to the TOML tables with errors that name file and field."""

    def __init__(self, path: Path, doc: dict[str, Any]) -> None:
        self.path = path
        self.doc = doc

    def fail(self, field: str, expected: str) -> SpecError:
        return SpecError(self.path, field, expected)

    def table(self, name: str, required: bool = True) -> dict[str, Any]:
        value = self.doc.get(name)
        if value is None:
            if required:
                raise self.fail(f"[{name}]", "missing section")
            return {}
        if not isinstance(value, dict):
            raise self.fail(name, "expected a table")
        unknown = sorted(set(value) - _SECTIONS[name])
        if unknown:
            raise self.fail(
                f"{name}.{unknown[0]}", f"unknown field; expected one of {', '.join(sorted(_SECTIONS[name]))}"
            )
        return value

    def get(
        self, table: dict[str, Any], section: str, key: str, kind: type | tuple[type, ...], default: Any = ...
    ) -> Any:
        field = f"{section}.{key}"
        if key not in table:
            if default is ...:
                raise self.fail(field, "missing (required)")
            return default
        value = table[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds:
            raise self.fail(field, f"expected {_kind_name(kinds)}, got a boolean")
        if not isinstance(value, kinds):
            raise self.fail(field, f"expected {_kind_name(kinds)}, got {type(value).__name__} {value!r}")
        return value

    def number(
        self,
        table: dict[str, Any],
        section: str,
        key: str,
        default: Any = ...,
        minimum: float = 0.0,
        strict: bool = False,
    ) -> float:
        value = float(self.get(table, section, key, (int, float), default))
        if value < minimum or (strict and value == minimum):
            raise self.fail(
                f"{section}.{key}", f"expected a number {'>' if strict else '>='} {minimum:g}, got {value:g}"
            )
        return value

    def count(self, table: dict[str, Any], section: str, key: str, default: Any = ..., minimum: int = 1) -> int:
        value = self.get(table, section, key, int, default)
        if value < minimum:
            raise self.fail(f"{section}.{key}", f"expected an integer >= {minimum}, got {value}")
        return value


def _kind_name(kinds: tuple[type, ...]) -> str:
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "true or false",
        list: "a list",
        dict: "a table",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def load_spec(path: str | os.PathLike[str]) -> Spec:
    """Parse and validate the study file at `path` (model and inputs included)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(p, "(file)", "study file not found")
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(p, "(syntax)", f"not valid TOML: {exc}") from exc
    return spec_from_doc(doc, p)


def spec_from_doc(doc: dict[str, Any], path: Path) -> Spec:
    """Validate a study file's contents; `path` names it in errors and its folder anchors relative paths."""
    p = Path(path)
    r = _Reader(p, doc)
    if not isinstance(doc, dict):
        raise r.fail("(file)", "expected a table of sections")
    unknown = sorted(set(doc) - set(_SECTIONS))
    if unknown:
        raise r.fail(f"[{unknown[0]}]", f"unknown section; expected {', '.join(_SECTIONS)}")
    base = p.parent.resolve()

    study = r.table("study")
    name = r.get(study, "study", "name", str)
    if not _NAME.match(name):
        raise r.fail("study.name", "expected letters, digits, '.', '_' or '-' (at most 100 characters)")
    storage = r.get(study, "study", "storage", str, "")
    work_dir = base / r.get(study, "study", "work_dir", str, f".tuner/{name}")

    model = _model(r, base)
    data = _data(r, base, model)
    accuracy = _accuracy(r, model)
    objective = _objective(r, model)
    backend = _backend(r)
    run = _run(r)
    if data.gate_samples > data.samples:
        raise r.fail("data.gate_samples", f"expected at most data.samples ({data.samples}), got {data.gate_samples}")
    spec = Spec(p.resolve(), name, storage, work_dir, model, data, accuracy, objective, backend, run, raw=doc)
    _check_space(r, spec)
    return spec


def _model(r: _Reader, base: Path) -> ModelSpec:
    from tuner.spec.onnx_check import read_inputs

    t = r.table("model")
    path = _file(base, r.get(t, "model", "path", str))
    graph_inputs = read_inputs(r, path)
    declared = r.get(t, "model", "inputs", dict, {})
    extra = sorted(set(declared) - set(graph_inputs))
    if extra:
        raise r.fail(
            f"model.inputs.{extra[0]}", f"the model has no such input; its inputs are {', '.join(graph_inputs)}"
        )
    shapes: dict[str, tuple[int, ...]] = {}
    axes: dict[str, int | None] = {}
    for name, (_dtype, dims) in graph_inputs.items():
        field = f"model.inputs.{name}"
        entry = declared.get(name, {})
        if not isinstance(entry, dict) or set(entry) - {"shape", "batch_axis"}:
            raise r.fail(field, "expected a table { shape = [ ... ], batch_axis = N } (shape [] for a scalar)")
        if "shape" in entry:
            shapes[name] = _shape(r, f"{field}.shape", entry["shape"], dims)
        elif dims is None or any(d is None for d in dims):
            raise r.fail(
                field,
                f"the model's input has dynamic dimensions {_dims(dims)}; give its shape, e.g. {{ shape = [1, ...] }}",
            )
        else:
            shapes[name] = tuple(int(d) for d in dims)  # type: ignore[arg-type]
        axes[name] = _batch_axis(r, f"{field}.batch_axis", entry, shapes[name])
    dims = {n: None if d is None else tuple(d) for n, (_, d) in graph_inputs.items()}
    return ModelSpec(path, shapes, {n: dt for n, (dt, _) in graph_inputs.items()}, axes, dims)


def _file(base: Path, text: str) -> Path:
    """A file named in the study file, relative to its folder, with `.` and `..` folded away (symbolic links kept as
    named)."""
    return Path(os.path.normpath(base / text))


def _shape(r: _Reader, field: str, shape: Any, dims: list[int | None] | None) -> tuple[int, ...]:
    """A declared input shape: positive integers ([] for a scalar) that fit the model's dimensions."""
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise r.fail(field, "expected a list of positive integers ([] for a scalar)")
    if dims is not None and (len(shape) != len(dims) or any(d is not None and d != s for d, s in zip(dims, shape))):
        raise r.fail(field, f"{shape} does not match the model's input {_dims(dims)}")
    return tuple(shape)


def _batch_axis(r: _Reader, field: str, entry: dict[str, Any], shape: tuple[int, ...]) -> int | None:
    """The declared batch axis (default 0); a scalar has none."""
    if "batch_axis" not in entry:
        return 0 if shape else None
    axis = entry["batch_axis"]
    if not shape:
        raise r.fail(field, "a scalar input (shape []) has no batch axis")
    if not isinstance(axis, int) or isinstance(axis, bool) or not 0 <= axis < len(shape):
        raise r.fail(field, f"expected an integer axis from 0 to {len(shape) - 1} of shape {list(shape)}, got {axis!r}")
    return axis


def _dims(dims: list[int | None] | None) -> str:
    if dims is None:
        return "(rank unknown)"
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _data(r: _Reader, base: Path, model: ModelSpec) -> DataSpec:
    t = r.table("data", required=False)
    file = r.get(t, "data", "file", str, None)
    path = _file(base, file) if file else None
    samples = r.count(t, "data", "samples", 8)
    gate = r.count(t, "data", "gate_samples", min(2, samples))
    low = r.get(t, "data", "low", (int, float), -1.0)
    high = r.get(t, "data", "high", (int, float), 1.0)
    if high <= low:
        raise r.fail("data.high", f"expected a value above data.low ({low})")
    per_input = _input_data(r, r.get(t, "data", "inputs", dict, {}), model, path is not None, (float(low), float(high)))
    spec = DataSpec(path, r.get(t, "data", "seed", int, 0), samples, gate, float(low), float(high), per_input)
    if path is not None:
        from tuner.measure.inputs import check_data_file

        try:
            check_data_file(path, model, samples, constants=frozenset(per_input))
        except TunerError as exc:
            raise r.fail("data.file", str(exc)) from exc
    return spec


def _input_data(
    r: _Reader, tables: dict[str, Any], model: ModelSpec, from_file: bool, default: tuple[float, float]
) -> dict[str, InputData]:
    """`[data.inputs.NAME]`: a constant `value`, or a `low`/`high` range typed like the input (either end
    defaults to data.low/data.high; integers are drawn from [low, high), so high may be one past the type's max)."""
    import numpy as np

    out: dict[str, InputData] = {}
    for name, entry in tables.items():
        field = f"data.inputs.{name}"
        if name not in model.inputs:
            raise r.fail(field, f"the model has no such input; its inputs are {', '.join(model.inputs)}")
        if not isinstance(entry, dict) or not entry or set(entry) - {"value", "low", "high"}:
            raise r.fail(field, "expected a table with value = ..., or low = ... and/or high = ...")
        dtype = np.dtype(model.dtypes[name])
        if "value" in entry:
            if len(entry) > 1:
                raise r.fail(f"{field}.value", "give either value or a low/high range, not both")
            out[name] = InputData(value=_typed(r, f"{field}.value", entry["value"], dtype))
            continue
        if from_file:
            raise r.fail(
                f"{field}.{next(iter(entry))}",
                f"a range applies to generated inputs; with data.file, {name!r} comes from the file (give value = ... "
                "to set it here)",
            )
        if dtype == np.bool_:
            raise r.fail(f"{field}.{next(iter(entry))}", "a boolean input takes value = true or false, not a range")
        lo = _typed(r, f"{field}.low", entry["low"], dtype) if "low" in entry else None
        hi = _typed(r, f"{field}.high", entry["high"], dtype, past_max=True) if "high" in entry else None
        if (default[1] if hi is None else hi) <= (default[0] if lo is None else lo):
            end = "high" if "high" in entry else "low"
            raise r.fail(
                f"{field}.{end}",
                f"expected high above low; the range is [{default[0] if lo is None else lo}, "
                f"{default[1] if hi is None else hi})",
            )
        out[name] = InputData(low=lo, high=hi)
    return out


def _typed(r: _Reader, field: str, value: Any, dtype: Any, past_max: bool = False) -> float | int | bool:
    """`value` checked against the input's element type: a boolean, an integer in range (up to one past
    the type's max with `past_max`, for an exclusive upper end), or a number."""
    import numpy as np

    if dtype == np.bool_:
        if not isinstance(value, bool):
            raise r.fail(field, f"expected true or false (the input is bool), got {value!r}")
        return value
    if np.issubdtype(dtype, np.integer):
        if not isinstance(value, int) or isinstance(value, bool):
            raise r.fail(field, f"expected an integer (the input is {dtype}), got {value!r}")
        info = np.iinfo(dtype)
        top = int(info.max) + int(past_max)
        if not info.min <= value <= top:
            raise r.fail(field, f"expected an integer from {info.min} to {top} (the input is {dtype}), got {value}")
        return value
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise r.fail(field, f"expected a number (the input is {dtype}), got {value!r}")
    return float(value)


def _accuracy(r: _Reader, model: ModelSpec) -> AccuracySpec:
    t = r.table("accuracy")
    metric = r.get(t, "accuracy", "metric", str)
    sha = _metric(r, "accuracy.metric", metric, plugin=True)
    tolerance = r.number(t, "accuracy", "tolerance")
    atol, rtol = r.number(t, "accuracy", "atol", 1e-3), r.number(t, "accuracy", "rtol", 1e-3)
    outputs = _output_rules(r, r.get(t, "accuracy", "outputs", dict, {}), model, Tolerances(atol, rtol))
    if outputs and tolerance == 0 and any(rule.tolerance != tolerance for rule in outputs.values()):
        raise r.fail("accuracy.tolerance", "expected a number > 0 when [accuracy.outputs.*] give other tolerances")
    return AccuracySpec(metric, tolerance, atol, rtol, outputs, sha)


def _metric(r: _Reader, field: str, metric: str, plugin: bool) -> str:
    """Check a metric name (a built-in one, or with `plugin` a study function); the function's file hash or ''."""
    from tuner.measure.accuracy import METRICS
    from tuner.measure.user_metric import is_plugin, load_metric, source_hash

    if metric in METRICS:
        return ""
    if not (plugin and is_plugin(metric)):
        also = " or package.module:function" if plugin else ""
        raise r.fail(field, f"expected one of {', '.join(METRICS)}{also}, got {metric!r}")
    try:
        return source_hash(load_metric(metric))
    except ValueError as exc:
        raise r.fail(field, str(exc)) from exc


def _output_rules(r: _Reader, table: dict[str, Any], model: ModelSpec, study: Tolerances) -> dict[str, Rule]:
    """[accuracy.outputs.NAME]: each a built-in metric and tolerance (atol/rtol default to the study's)."""
    from tuner.spec.onnx_check import read_output_names

    if not table:
        return {}
    names = read_output_names(model.path)
    rules: dict[str, Rule] = {}
    for name, entry in table.items():
        section = f"accuracy.outputs.{name}"
        if name not in names:
            raise r.fail(section, f"the model has no such output; its outputs are {', '.join(names)}")
        if not isinstance(entry, dict):
            raise r.fail(section, "expected a table { metric = ..., tolerance = ... }")
        unknown = sorted(set(entry) - {"metric", "tolerance", "atol", "rtol"})
        if unknown:
            raise r.fail(f"{section}.{unknown[0]}", "unknown field; expected one of atol, metric, rtol, tolerance")
        metric = r.get(entry, section, "metric", str)
        _metric(r, f"{section}.metric", metric, plugin=False)
        tol = Tolerances(r.number(entry, section, "atol", study.atol), r.number(entry, section, "rtol", study.rtol))
        rules[name] = Rule(metric, r.number(entry, section, "tolerance"), tol)
    return rules


def _objective(r: _Reader, model: ModelSpec) -> ObjectiveSpec:
    """[objective]: every declared setting (`tuner.objective`), checked against its declaration; absent ones at their
    default. The shapes are checked against the model (`tuner.spec.shapes`), the cores against this machine's."""
    from tuner.spec.shapes import read_shapes

    t = r.table("objective", required=False)
    values = {}
    for name, default, s in objective_settings():
        if name in t:
            kind = value_type(name)
            values[name] = read_shapes(r, t[name], model) if kind is tuple else _setting(r, t, name, default, s)
    cores = values.get("cores")
    if cores is not None and cores > len(os.sched_getaffinity(0)):
        raise r.fail("objective.cores", f"expected at most the {len(os.sched_getaffinity(0))} cores allowed here")
    return ObjectiveSpec(**values)


def _setting(r: _Reader, t: dict[str, Any], name: str, default: Any, s: Any) -> Any:
    """One declared [objective] setting: a string among its choices, an integer or a number within its bounds."""
    field = f"objective.{name}"
    kind = value_type(name)
    if s.choices:
        value = r.get(t, "objective", name, str)
        if value not in s.choices:
            raise r.fail(field, f"expected one of {', '.join(s.choices)}, got {value!r}")
        return value
    if kind is int:
        return r.count(t, "objective", name, minimum=int(s.minimum or 0))
    value = r.number(t, "objective", name, minimum=s.minimum or 0.0, strict=s.strict)
    if s.below is not None and value >= s.below:
        raise r.fail(field, f"expected {s.bound_hint or f'a number below {s.below:g}'}, got {value:g}")
    return value


def _backend(r: _Reader) -> BackendSpec:
    t = r.table("backend")
    name = r.get(t, "backend", "name", str)
    space = r.get(t, "backend", "space", dict, {})
    for key, values in space.items():
        if not isinstance(values, list):
            raise r.fail(f"backend.space.{key}", "expected a list of allowed values")
    return BackendSpec(name, dict(space), dict(r.get(t, "backend", "options", dict, {})))


def _run(r: _Reader) -> RunSpec:
    t = r.table("run")
    sampler = r.get(t, "run", "sampler", str, DEFAULT_SAMPLER)
    if sampler not in SAMPLERS:
        raise r.fail("run.sampler", f"expected one of {', '.join(SAMPLERS)}, got {sampler!r}")
    if sampler == "gp":
        for module in ("scipy", "torch"):
            require(module, f"{r.path}: run.sampler: 'gp'", "pip install 'route-tuner[gp]'")
    return RunSpec(
        budget=r.count(t, "run", "budget"),
        workers=r.count(t, "run", "workers", 1),
        trial_timeout_s=r.number(t, "run", "trial_timeout_s", 600.0, strict=True),
        heartbeat_s=r.number(t, "run", "heartbeat_s", 5.0, strict=True),
        grace_s=r.number(t, "run", "grace_s", 60.0, strict=True),
        max_attempts=r.count(t, "run", "max_attempts", RunSpec.max_attempts),
        sampler=sampler,
        seed=r.get(t, "run", "seed", int, 0),
        startup_trials=r.count(t, "run", "startup_trials", DEFAULT_STARTUP_TRIALS, minimum=0),
        racing=r.get(t, "run", "racing", bool, True),
        warm_start=_choice(r, t, "warm_start", WARM_START_MODES, RunSpec.warm_start),
        keep_best=r.count(t, "run", "keep_best", 3),
        max_disk_mb=r.number(t, "run", "max_disk_mb", strict=True) if "max_disk_mb" in t else None,
        mix_devices=r.get(t, "run", "mix_devices", bool, False),
        timeout_s=r.number(t, "run", "timeout_s", strict=True) if "timeout_s" in t else None,
    )


def _choice(r: _Reader, t: dict[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
    value = r.get(t, "run", key, str, default)
    if value not in choices:
        raise r.fail(f"run.{key}", f"expected one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def _check_space(r: _Reader, spec: Spec) -> None:
    """The backend exists, the options are ones it declares, and the study's restrictions name real knobs and values."""
    from tuner.backends import get_backend
    from tuner.backends.base import ModelInfo

    try:
        backend = get_backend(spec.backend.name)
    except TunerError as exc:
        raise r.fail("backend.name", str(exc)) from exc
    try:  # an option check that needs a missing library, or the space, raises MissingLibrary
        problem = backend.option_problem(spec.backend.options)
        if problem:
            raise r.fail(f"backend.options.{problem[0]}", problem[1])
        backend.check_libraries()
        space = backend.space(ModelInfo(spec.model.path, spec.model.inputs, spec.backend.options))
    except MissingLibrary as exc:
        raise MissingLibrary(f"{r.path}: {exc}") from None
    try:
        space.restrict(spec.backend.space)
    except KeyError as exc:
        raise r.fail(
            f"backend.space.{exc.args[0].split(',')[0]}",
            f"unknown parameter; expected one of {', '.join(space.names())}",
        ) from exc
    except ValueError as exc:
        name, _, msg = str(exc).partition(": ")
        raise r.fail(f"backend.space.{name}", msg) from exc


def resolve_storage(spec: Spec, override: str | None = None) -> str:
    """The storage URL: --storage, then $TUNER_STORAGE, then the study file, then SQLite in work_dir."""
    url = override or os.environ.get(STORAGE_ENV) or spec.storage
    if url:
        return normalize_url(url)
    return f"sqlite:///{spec.work_dir / 'study.db'}"  # the folder is made by what writes (`make_storage_dir`)


def make_storage_dir(url: str) -> None:
    """Make the folder of a SQLite storage file, before a command that writes opens it (reading ones never do)."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
        Path(u.database).parent.mkdir(parents=True, exist_ok=True)
