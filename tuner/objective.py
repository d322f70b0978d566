"""The study's objective and timing settings (`[objective]` in the study file), each declared once.

A setting is one field of `ObjectiveSpec`, made with `setting(...)`: its type (the annotation), its
default, what it means, the values it accepts, and whether it is part of the cache key and of the
resume fingerprint. Everything that needs the settings walks these fields: the study-file loader
(`tuner.spec.load`), the trial's job (`tuner.job.Job.objective`), the cache key (`cache_part`), the
resume fingerprint (`fingerprint_part`) and the device defaults of the timing (`resolved`). Adding a
setting is one field here; nothing else can miss it.

A setting added after cache keys were first stored declares `late=True`: it joins the key only when
it differs from its default, so a stored result whose key was made before the setting existed (and
was therefore measured at the default) is still found.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from tuner.measure.paired import CONTENTION, EXCLUSIVE, MODES, PER_CALL
from tuner.measure.timing import STATISTICS

CPU, GPU = "cpu", "gpu"


@dataclass(frozen=True)
class Setting:
    """What the study file accepts for one setting, and what it is part of.

    `choices`: the accepted strings; `minimum` (excluded when `strict`) and `below` (excluded) bound a
    number, `bound_hint` says what the upper bound means. A setting whose default is None takes the
    device's default, `device[CPU]` or `device[GPU]`, in the trial's child (`resolved`).
    """

    doc: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    strict: bool = False
    below: float | None = None
    bound_hint: str = ""
    device: dict[str, float] | None = None
    key: bool = True  # part of the cache key: a stored result measured under another value is not reused
    late: bool = False  # joined the cache key after keys were stored: in it only when not at its default
    fingerprint: bool = True  # part of the resume fingerprint: a study is not resumed under another value


def setting(default: Any, doc: str, **kw: Any) -> Any:
    """A declared `ObjectiveSpec` field (see `Setting` for the keywords)."""
    return field(default=default, metadata={"setting": Setting(doc, **kw)})


@dataclass(frozen=True)
class ObjectiveSpec:
    """Which latency statistic to minimise and how to measure it (`tuner.measure.paired`, `tuner.worker.timing`)."""

    statistic: str = setting(
        "median", "the latency statistic minimised (over each timing block's calls)", choices=STATISTICS, late=True
    )
    warmup_s: float = setting(0.2, "the least warm-up per engine; it goes on until block statistics agree", minimum=0.0)
    min_repeats: int = setting(20, "the fewest timed calls per engine", minimum=1)
    min_duration_s: float | None = setting(
        None, "the least measuring time (paired: both engines together)", minimum=0.0, device={CPU: 0.5, GPU: 3.0}
    )
    mode: str = setting(
        PER_CALL, "'per-call' latency, or 'pipelined': back-to-back calls, mean per call", choices=MODES
    )
    target_halfwidth: float = setting(
        0.02,
        "stop when the speedup interval is within about ±this",
        minimum=0.0,
        strict=True,
        below=1.0,
        bound_hint="a relative half-width below 1 (0.02 is ±2 %)",
    )
    timing_cap_s: float | None = setting(
        None,
        "the most a trial's timing may take (the minimum cycles always run)",
        minimum=0.0,
        strict=True,
        device={CPU: 10.0, GPU: 20.0},
    )
    block_s: float | None = setting(
        None, "the length of one timing block", minimum=0.0, strict=True, device={CPU: 0.05, GPU: 0.05}
    )
    contention: str = setting(
        EXCLUSIVE,
        "'exclusive': the deployment has its cores to itself: timings run at raised priority where the process may "
        "(root or CAP_SYS_NICE), a timing cycle during which other processes took a core the timing needed is timed "
        "again, and a measurement that stays contended decides nothing; 'shared': "
        "the deployment runs beside other work and is timed beside it: contention is recorded, not acted on "
        "(the host timing lock orders the tuner's own builds and timings; it never kept other work away)",
        choices=CONTENTION,
        late=True,
    )
    cores: int | None = setting(
        None,
        "the cores the deployment gets: every timing of the study (the baseline's included) runs pinned to this "
        "many cores (CPU affinity), and thread counts above it are not proposed; unset: every core allowed",
        minimum=1,
        late=True,
    )
    shapes: tuple[dict[str, Any], ...] = setting(
        (),
        "the input shapes the deployment serves, with weights ([[objective.shapes]]): each trial is timed paired "
        "with the default at every shape and its speedup is the weighted geometric mean; empty: the [model] shapes",
        late=True,
    )
    max_memory_mb: float | None = setting(
        None,
        "the most memory (MiB) an engine may add while it loads and runs: host RSS on the CPU, device memory on a GPU; "
        "a route above it is infeasible",
        minimum=0.0,
        strict=True,
        key=False,
    )  # decides feasibility, not what is measured

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> ObjectiveSpec:
        """Rebuild from `plain()` (a job's JSON); keys it does not declare are refused by the constructor."""
        return cls(**{**data, "shapes": tuple(data.get("shapes") or ())})

    def plain(self) -> dict[str, Any]:
        """Every setting as JSON data (lists, not tuples), as stored in a fingerprint or a job."""
        return json.loads(json.dumps(asdict(self)))

    def resolved(self, device: str) -> ObjectiveSpec:
        """These settings with every unset (None) one at `device`'s default (CPU or GPU)."""
        return replace(
            self, **{name: s.device[device] for name, _, s in settings() if s.device and getattr(self, name) is None}
        )


def settings() -> list[tuple[str, Any, Setting]]:
    """(name, default, declaration) of every objective setting, in declaration order."""
    return [(f.name, f.default, f.metadata["setting"]) for f in fields(ObjectiveSpec)]


def value_type(name: str) -> type:
    """The type a setting's value has when set (its annotation without None)."""
    hint = get_type_hints(ObjectiveSpec)[name]
    if get_origin(hint) in (Union, UnionType):
        hint = next(k for k in get_args(hint) if k is not type(None))
    return get_origin(hint) or hint


def spec_of(name: str) -> Setting:
    """The declaration of setting `name`."""
    return next(s for n, _, s in settings() if n == name)


def fingerprint_part(objective: ObjectiveSpec) -> dict[str, Any]:
    """The settings a resumed study must agree on, by name."""
    plain = objective.plain()
    return {name: plain[name] for name, _, s in settings() if s.fingerprint}


def cache_part(objective: ObjectiveSpec) -> list[Any]:
    """The settings a stored result depends on: the first keyed ones by position, then late ones away from their
    default."""
    plain = objective.plain()
    defaults = ObjectiveSpec().plain()
    out: list[Any] = [plain[name] for name, _, s in settings() if s.key and not s.late]
    late = {name: plain[name] for name, _, s in settings() if s.key and s.late and plain[name] != defaults[name]}
    return out + [late] if late else out
