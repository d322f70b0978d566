"""How much of the cores other work took while a timing ran: measured per block, not assumed.

The host timing lock (`tuner.measure.exclusive`) keeps other tuner processes out, nothing else.
Pairing cancels drift that moves both engines alike, not contention, which slows a session with
more threads (one waits for a core) far more than a one-thread one. So each timing block records:

- `others_cores`: the CPU time other processes used on the CPUs this process may run on, per
  second of the block (busy time of those CPUs from `/proc/stat`, less this process's own CPU time
  from `resource.getrusage`; `/proc/stat` counts in clock ticks, so this is coarse for short blocks);
- `wait_share`: of the CPU time this process's threads asked for, the share they spent runnable
  but waiting for a core (`/proc/self/task/*/schedstat`, nanoseconds);
- `host_cores`: every CPU's busy time per second (the study's share of the host is `self_cores`
  over it).
A block is *contended* when other processes used at least OTHERS_MIN of a core and our threads
waited for more than WAIT_MAX of their time: a thread of ours wanted a core that other work had.
Where `/proc` cannot be read (not Linux) nothing is measured and nothing is contended.
"""

from __future__ import annotations

import glob
import os
import resource
import time
from dataclasses import dataclass
from typing import Any

OTHERS_MIN = 0.1  # cores other processes must have used on our CPUs ...
WAIT_MAX = 0.05  # ... while our threads waited for a core this share of their time, for a block to be contended


@dataclass(frozen=True)
class Snapshot:
    """Counters at one instant."""

    wall: float
    ours_busy: float  # seconds of busy time of the CPUs this process may use
    host_busy: float  # seconds of busy time of every CPU
    self_cpu: float  # this process's CPU seconds (all threads)
    run: float  # this process's threads' on-CPU seconds (schedstat)
    wait: float  # this process's threads' run-queue seconds (schedstat)


@dataclass(frozen=True)
class Load:
    """What other work took during one block."""

    wall_s: float
    others_cores: float
    wait_share: float
    self_cores: float
    host_cores: float

    @property
    def contended(self) -> bool:
        """Other processes had a core that one of our threads wanted."""
        return self.others_cores >= OTHERS_MIN and self.wait_share > WAIT_MAX


class Probe:
    """Reads the counters of this process and of the CPUs it may run on."""

    def __init__(self) -> None:
        self.cpus = {f"cpu{c}" for c in os.sched_getaffinity(0)}
        self.tick = 1.0 / os.sysconf("SC_CLK_TCK")

    def snapshot(self) -> Snapshot | None:
        """The counters now, or None where they cannot be read."""
        try:
            with open("/proc/stat") as f:
                lines = [line.split() for line in f if line.startswith("cpu") and not line.startswith("cpu ")]
            run = wait = 0
            for path in glob.glob("/proc/self/task/*/schedstat"):
                try:
                    with open(path) as f:
                        fields = f.read().split()
                except OSError:
                    continue  # the thread ended meanwhile
                run, wait = run + int(fields[0]), wait + int(fields[1])
        except (OSError, ValueError, IndexError):
            return None
        busy = {
            f[0]: sum(map(int, f[1:4])) + sum(map(int, f[6:9])) for f in lines
        }  # user nice system, irq softirq steal
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return Snapshot(
            time.perf_counter(),
            self.tick * sum(v for k, v in busy.items() if k in self.cpus),
            self.tick * sum(busy.values()),
            usage.ru_utime + usage.ru_stime,
            run / 1e9,
            wait / 1e9,
        )

    def since(self, start: Snapshot | None) -> Load | None:
        """What happened since `start`, or None when nothing could be read."""
        end = self.snapshot()
        if start is None or end is None:
            return None
        wall = max(end.wall - start.wall, 1e-9)
        mine = end.self_cpu - start.self_cpu
        asked = (end.run - start.run) + (end.wait - start.wait)
        return Load(
            wall,
            max(0.0, end.ours_busy - start.ours_busy - mine) / wall,
            (end.wait - start.wait) / asked if asked > 0 else 0.0,
            mine / wall,
            (end.host_busy - start.host_busy) / wall,
        )


def summarize(loads: list[Load | None]) -> dict[str, Any]:
    """A measurement's contention: how many blocks were contended, and how much the others took on average and at
    most."""
    seen = [x for x in loads if x is not None]
    if not seen:
        return {"measured": False}
    wall = sum(x.wall_s for x in seen)

    def mean(attr: str) -> float:
        return round(sum(getattr(x, attr) * x.wall_s for x in seen) / wall, 4)

    return {
        "measured": True,
        "blocks": len(seen),
        "contended_blocks": sum(x.contended for x in seen),
        "others_cores": mean("others_cores"),
        "others_cores_max": round(max(x.others_cores for x in seen), 4),
        "wait_share": mean("wait_share"),
        "self_cores": mean("self_cores"),
        "host_cores": mean("host_cores"),
        "study_share": round(mean("self_cores") / mean("host_cores"), 4) if mean("host_cores") > 0 else None,
    }
