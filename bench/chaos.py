"""Chaos benchmark: a PostgreSQL study with 4 workers on fixed-cost builds and a seeded schedule of faults.

Faults, in a seeded order, each when a seeded number of trials has finished: SIGKILL of a random
worker (x2) and of a random trial child (x3), SIGSTOP of a worker until its trial is reaped (past
`grace_s`) then SIGCONT, a real PostgreSQL restart, a long database outage, a full work dir, and:
- `stop_baseline`: first of all, the worker of trial 0 (the baseline) is SIGSTOPped until it is reaped;
- `stop_in_lock`: a worker caught holding the study lock and a trial (inside reserve or tell: the holder of
  the advisory lock, traced from the server's session to the process through the proxy) is
  SIGSTOPped until its trial is reaped;
- `commit_drops`: the connection is broken after the COMMIT and before its reply, once at each step
  of the lifecycle: reap, tell, re-queue and record (`tests.pg_faults`, in the proxy);
- `freeze_short`, `freeze_long_sigterm`: the whole PostgreSQL cluster SIGSTOPped for less, then more,
  than the keepalive timeout; during the long one `tuner run` gets SIGTERM and must end within 15 s
  (the study is then resumed by a new `tuner run`);
- `partition_host`: a second host (its own network, UTS and PID namespaces, joined by a veth pair)
  runs the study beside the first; its link is cut in the middle of one of its tells, then restored;
- `squat_locks`: another local user opens and `flock`s whatever it can of the timing lock files;
- `gc_during_racing`: `tuner gc --yes` while a worker re-measures a leader;
and at the end `two_confirmations`: two `tuner run`s confirm at once.
Then the study is resumed (`tuner run` again) until its budget is spent, and the database, the
build log and the process table are checked. Beside the counts, the waste: budget spent on
timeouts, routes lost more than once, every run's exit status and (with a fault-free run of the same
seed first) the time to finish against that run.

The study runs on a private PostgreSQL cluster (initdb in a temporary directory, its own port), so it
can be restarted without touching the shared one; the outage is a TCP proxy on 127.0.0.1 that is cut
and restored (tests/proxy.py). The work dir is a tmpfs (mounted here; needs root).

Writes bench/results/chaos.json (one entry per seed, merged with earlier seeds) and prints a table.
Usage: python bench/chaos.py --seed 1 --outage-s 360   (one seed per call; run seeds in sequence)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.errors

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import commit  # noqa: E402
from tests.helpers import proc_stat, running  # noqa: E402
from tests.models import conv_model  # noqa: E402
from tests.pg_faults import Watch  # noqa: E402
from tests.proxy import TcpProxy  # noqa: E402
from tuner.spec.toml import dumps  # noqa: E402
from tuner.store.db import lock_key  # noqa: E402
from tuner.worker.environment import ENV_REQUEUES  # noqa: E402

PG_BIN = (
    sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1] if Path("/usr/lib/postgresql").exists() else Path("/usr/bin")
)
FAULTS = (
    "kill_worker",
    "kill_worker",
    "kill_child",
    "kill_child",
    "kill_child",
    "stop_worker",
    "pg_restart",
    "outage",
    "disk_full",
    "stop_in_lock",
    "commit_drops",
    "freeze_short",
    "freeze_long_sigterm",
    "partition_host",
    "squat_locks",
    "gc_during_racing",
)
FIRST, LAST = (
    ("stop_baseline",),
    ("two_confirmations",),
)  # at the start of the run, and after the study's budget is spent
STEPS = ("reap", "tell", "requeue", "record")  # where a connection is broken after COMMIT
# Bounds shortened for the benchmark (names of tuner.store.db.PgTimeouts): a frozen lock holder's session
# ends after 30 s idle, and TCP keepalives give up after about 5 + 2 * 3 = 11 s.
PG_TIMEOUTS = "lock_hold_s=30,keepalive_idle_s=5,keepalive_interval_s=2,keepalive_count=3"
WAIT_S = 900.0  # the longest wait for the moment a fault needs (a loaded machine starts a study slowly)
FREEZE_SHORT_S, FREEZE_LONG_S = 5.0, 40.0  # shorter and longer than that keepalive timeout
SIGTERM_LIMIT_S = 15.0
SQUATTER = "tuner-chaos-squat"
NETNS = "tuner-chaos"
ENV_PATTERN = re.compile(r"no space left|ENOSPC|out of memory|MemoryError|SIGKILL|environment", re.IGNORECASE)
RESULTS = REPO / "bench" / "results" / "chaos.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateCluster:
    """A throw-away PostgreSQL cluster of our own, on its own port, that may be restarted freely."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.port = _free_port()

    def _as_postgres(self, *cmd: str) -> None:
        # No pipes: the server inherits pg_ctl's stdout, and a pipe would never reach end-of-file.
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *cmd],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=180,
        )

    def start(self) -> None:
        """initdb (trust auth) and start."""
        shutil.chown(self.root, "postgres")
        self._as_postgres(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust")
        self._as_postgres(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-w",
            "-o",
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200",
            "start",
        )

    def restart(self) -> None:
        """A real server restart: every connection is dropped."""
        self._as_postgres(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-w",
            "-m",
            "fast",
            "restart",
        )

    def stop(self) -> None:
        """Stop the server (the data directory goes with the temporary directory)."""
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-w", "-m", "immediate", "stop")

    def pids(self) -> list[int]:
        """The postmaster and every process it started (backends, checkpointer, ...)."""
        master = int((self.data / "postmaster.pid").read_text().split()[0])
        return [master] + [pid for pid, ppid, _ in _procs() if ppid == master]

    def url(self, database: str, port: int | None = None) -> str:
        return f"postgresql://postgres@127.0.0.1:{port or self.port}/{database}"

    def create(self, database: str) -> None:
        conn = psycopg2.connect(self.url("postgres"))
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{database}"')
        conn.close()


def _query(url: str, sql: str, args: tuple = ()) -> list[tuple]:
    """Run one query straight on the cluster (not through the proxy); waits out a restart."""
    for _ in range(600):
        try:
            conn = psycopg2.connect(url, connect_timeout=5)
            try:
                with conn.cursor() as cur:
                    cur.execute(sql, args)
                    return list(cur.fetchall())
            finally:
                conn.close()
        except (
            psycopg2.OperationalError,
            psycopg2.errors.UndefinedTable,
        ):  # restarting, or `tuner run` still setting up
            time.sleep(0.5)
    raise RuntimeError("the private cluster did not answer")


def _procs() -> list[tuple[int, int, str]]:
    """(pid, ppid, command line) of every process."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                stat = proc_stat(entry.name)
            except OSError:
                continue
            if stat[0] != "Z":
                out.append((int(entry.name), int(stat[1]), cmd))
    return out


def signal_each(pids: list[int], signum: int) -> list[int]:
    """Send `signum` to each of `pids`; those still there (a backend may end between listing and signal, and an ended
    backend the frozen postmaster had not reaped is reaped as soon as the postmaster continues)."""
    sent = []
    for pid in pids:
        try:
            os.kill(pid, signum)
            sent.append(pid)
        except ProcessLookupError:
            pass
    return sent


def _owner_of_port(port: int) -> int | None:
    """The process that owns the local TCP port `port` on 127.0.0.1 (IPv4), if any."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        cols = line.split()
        if int(cols[1].split(":")[1], 16) == port:
            inode = cols[9]
            break
    if inode is None:
        return None
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if any(os.readlink(fd) == f"socket:[{inode}]" for fd in (entry / "fd").iterdir()):
                    return int(entry.name)
            except OSError:
                continue
    return None


def _netns(seed: int) -> str:
    return f"{NETNS}-{seed}"


def _netns_addresses(seed: int) -> tuple[str, str]:
    """(this host's address, the other host's) on the veth pair of `seed`."""
    return f"10.213.{seed % 250}.1", f"10.213.{seed % 250}.2"


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


def _netns_up(seed: int) -> str:
    """Make the other host's network namespace and its veth link; '' on success, else why not."""
    _netns_down(seed)
    ns, (here, there) = _netns(seed), _netns_addresses(seed)
    for args in (
        ("netns", "add", ns),
        ("link", "add", f"tc{seed}a", "type", "veth", "peer", "name", f"tc{seed}b"),
        ("link", "set", f"tc{seed}b", "netns", ns),
        ("addr", "add", f"{here}/30", "dev", f"tc{seed}a"),
        ("link", "set", f"tc{seed}a", "up"),
        ("-n", ns, "addr", "add", f"{there}/30", "dev", f"tc{seed}b"),
        ("-n", ns, "link", "set", f"tc{seed}b", "up"),
        ("-n", ns, "link", "set", "lo", "up"),
    ):
        done = _ip(*args)
        if done.returncode != 0:
            return f"ip {' '.join(args)}: {done.stderr.strip()}"
    return ""


def _link(seed: int, state: str) -> None:
    """Bring both ends of the other host's link down (a partition: packets are dropped, not refused) or up."""
    _ip("link", "set", f"tc{seed}a", state)
    _ip("-n", _netns(seed), "link", "set", f"tc{seed}b", state)


def _netns_down(seed: int) -> None:
    _ip("link", "del", f"tc{seed}a")
    _ip("netns", "del", _netns(seed))


@dataclass
class Seed:
    """One seed's run: its study, its faults and what was found afterwards."""

    seed: int
    outage_s: float
    budget: int
    workers: int
    build_s: float
    grace_s: float
    root: Path
    schedule: tuple[str, ...] = FAULTS
    objective: dict[str, Any] = field(default_factory=dict)  # over the study's [objective] (recorded seeds: none)
    faults: list[dict[str, Any]] = field(default_factory=list)
    first: tuple[str, ...] = FIRST
    last: tuple[str, ...] = LAST

    def __post_init__(self) -> None:
        self.cluster = PrivateCluster(self.root / "pg")
        self.disk = self.root / "disk"
        self.spec = self.root / "chaos.toml"
        self.build_log = self.root / "builds"
        self.log = self.root / "run.log"
        self.rng = random.Random(self.seed)
        self.watch = Watch()
        self.runs: list[subprocess.Popen[bytes]] = []  # every `tuner run` of this host, in order
        self.other: subprocess.Popen[bytes] | None = None  # the second host's `tuner run`
        self.env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "COLUMNS": "200",
            "TUNER_PG_TIMEOUTS": PG_TIMEOUTS,
            "TUNER_LOCK_DIR": str(self.root / "locks"),
        }  # made by the tuner, in a folder others may enter

    # -- set-up ------------------------------------------------------------------------------

    def setup(self) -> None:
        (self.root / "pg").mkdir()
        self.cluster.start()
        self.cluster.create("chaos")
        self.direct = self.cluster.url("chaos")
        self.proxy = TcpProxy(self.cluster.port, watch=self.watch)
        self.proxy.start()
        self.url = self.cluster.url("chaos", self.proxy.port)
        self.disk.mkdir()
        # 512 MB: a trial of this microsecond model keeps about 3.5 MB of samples; 60 trials must fit
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", str(self.disk)], check=True)
        self.build_log.mkdir()
        conv_model(self.root / "tiny.onnx")
        self.spec.write_text(
            dumps(
                {
                    "study": {"name": f"chaos-{self.seed}", "work_dir": str(self.disk / "work")},
                    "model": {"path": str(self.root / "tiny.onnx")},
                    "data": {"samples": 2, "gate_samples": 1},
                    "accuracy": {"metric": "max_abs", "tolerance": 1e-3},
                    "objective": {
                        "warmup_s": 0.0,
                        "min_repeats": 3,
                        "min_duration_s": 0.0,
                        **self.objective,
                    },
                    "backend": {
                        "name": "bench.fixed_cost:LoggedFixedCostBackend",
                        "options": {"build_s": self.build_s, "build_log": str(self.build_log)},
                    },
                    "run": {
                        "budget": self.budget,
                        "workers": self.workers,
                        "sampler": "random",
                        "seed": self.seed,
                        "heartbeat_s": 1.0,
                        "grace_s": self.grace_s,
                        "trial_timeout_s": 120.0,
                    },
                }
            )
        )

    def teardown(self) -> None:
        for proc in [*self.runs, self.other]:
            if proc is not None and proc.poll() is None:
                proc.kill()
        _netns_down(self.seed)
        self.proxy.cut()
        subprocess.run(["umount", "-l", str(self.disk)], check=False)
        self.cluster.stop()

    # -- the run -----------------------------------------------------------------------------

    def start_run(self, *extra: str, confirm: bool = False) -> subprocess.Popen[bytes]:
        with open(self.log, "ab") as f:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tuner",
                    "run",
                    str(self.spec),
                    "--storage",
                    self.url,
                    *([] if confirm else ["--no-confirm"]),
                    *extra,
                ],
                stdout=f,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env=self.env,
            )
        self.runs.append(proc)
        return proc

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        """This host's current `tuner run`."""
        return self.runs[-1]

    def finished(self) -> int:
        return int(
            _query(self.direct, "SELECT count(*) FROM trials WHERE state IN ('COMPLETE', 'PRUNED', 'FAIL')")[0][0]
        )

    def workers_now(self) -> list[int]:
        return [pid for pid, _, cmd in _procs() if "tuner.worker.main" in cmd and str(self.spec) in cmd]

    def children_now(self) -> list[tuple[int, int]]:
        """(pid, its worker's pid) of every trial child of this run. A child forked by the study's server is the
        server's child, so its worker is found as the holder of its trial's lease (0: none holds it now)."""
        job = re.compile(re.escape(str(self.disk)) + r"/\S*/(\d+)/job\.json")  # the trial's folder is its number
        found = [
            (pid, int(m.group(1))) for pid, _, cmd in _procs() if "tuner.worker.child" in cmd and (m := job.search(cmd))
        ]
        if not found:
            return []
        leased = dict(
            _query(
                self.direct,
                "SELECT t.number, l.pid FROM tuner_leases l JOIN trials t USING (trial_id) WHERE l.state = 'running'",
            )
        )
        return [(pid, int(leased.get(number, 0))) for pid, number in found]

    def run(self) -> dict[str, Any]:
        """Run the study under the fault schedule, resume it, and measure."""
        order = self.rng.sample(self.schedule, len(self.schedule))
        triggers = (
            sorted(self.rng.sample(range(2, self.budget - len(self.schedule) // 2 - 2), len(self.schedule)))
            if order
            else []
        )
        t0 = time.monotonic()
        self.start_run()
        try:
            self.inject([*self.first], [0] * len(self.first), t0)
            self.inject(order, triggers, t0)
        finally:
            if self.proc.poll() is None and sys.exc_info()[0] is not None:
                self.proc.kill()
        self.proc.wait()
        for _ in range(5):
            counted, pending = self.counted_and_pending()
            if counted >= self.budget and not pending:
                break
            self.start_run().wait()
        if self.other is not None:
            self.other.wait(timeout=600)
        wall = time.monotonic() - t0
        self.inject([*self.last], [0] * len(self.last), t0, restart=False)
        exits = [p.returncode for p in self.runs]
        return {
            **self.measure(),
            "first_run_exit": exits[0],
            "run_exits": exits,
            "wall_s": round(wall, 1),
            "other_host_exit": self.other.returncode if self.other is not None else None,
        }

    def inject(self, order: list[str], triggers: list[int], t0: float, restart: bool = True) -> None:
        """Each fault in turn, once its number of trials has finished; a run that ended early (SIGTERM) is resumed."""
        for name, at in zip(order, triggers):
            while self.finished() < at and self.proc.poll() is None:
                time.sleep(0.2)  # polling the study's progress: faults are scheduled by trial count
            if self.proc.poll() is not None and restart:
                counted, pending = self.counted_and_pending()
                if counted >= self.budget and not pending:
                    self.faults.append({"fault": name, "at_trials": at, "skipped": "the study had ended"})
                    continue
                self.start_run()
            started = time.monotonic()
            detail = getattr(self, name)()
            self.faults.append(
                {
                    "fault": name,
                    "at_trials": at,
                    "t_s": round(started - t0, 1),
                    "duration_s": round(time.monotonic() - started, 1),
                    **detail,
                }
            )
            print(f"seed {self.seed}: {self.faults[-1]}", flush=True)

    # -- faults ----------------------------------------------------------------------------

    def _wait_for(self, what: str, limit_s: float = 60) -> list[Any]:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            found = self.workers_now() if what == "worker" else self.children_now()
            if found:
                return found
            time.sleep(0.1)
        return []

    def kill_worker(self) -> dict[str, Any]:
        busy = sorted({worker for _, worker in self._wait_for("child", 30)} & set(self.workers_now()))
        workers = busy or self._wait_for("worker")  # one in the middle of a trial, where there is one
        if not workers:
            return {"skipped": "no worker"}
        victim = self.rng.choice(sorted(workers))
        kids = [pid for pid, worker in self.children_now() if worker == victim]
        os.kill(victim, signal.SIGKILL)
        t = time.monotonic()
        while any(running(pid) for pid in kids) and time.monotonic() - t < 10:
            time.sleep(0.005)  # `gone_at_unix` below ends their builds: within 5 ms of the last one's end
        alive = [pid for pid in kids if running(pid)]
        return {
            "pid": victim,
            "children": len(kids),
            "children_gone": [pid for pid in kids if pid not in alive],
            "gone_at_unix": time.time(),
            "children_gone_after_s": round(time.monotonic() - t, 2),
            "children_left": len(alive),
        }

    def kill_child(self) -> dict[str, Any]:
        children = self._wait_for("child")
        if not children:
            return {"skipped": "no child"}
        pid, worker = self.rng.choice(sorted(children))
        os.kill(pid, signal.SIGKILL)
        return {"pid": pid, "worker": worker, "gone_at_unix": time.time()}

    def killed_children(self) -> dict[int, float]:
        """The children this run killed, directly or with their worker: pid -> Unix time by which they were gone."""
        killed: dict[int, float] = {}
        for f in self.faults:
            if f["fault"] == "kill_child" and "gone_at_unix" in f:
                killed[f["pid"]] = f["gone_at_unix"]
            elif f["fault"] == "kill_worker" and "gone_at_unix" in f:
                killed.update((pid, f["gone_at_unix"]) for pid in f["children_gone"])
        return killed

    def stop_worker(self) -> dict[str, Any]:
        """SIGSTOP a worker that holds a trial until that trial is reaped; a worker caught between two trials
        holds nothing to reap, so the pick is made again (from the leases as they are then) for up to 30 s."""
        deadline = time.monotonic() + 30
        out: dict[str, Any] = {"skipped": "no worker"}
        while time.monotonic() < deadline:
            leased = {int(r[0]) for r in _query(self.direct, "SELECT pid FROM tuner_leases WHERE state = 'running'")}
            workers = [w for w in self._wait_for("worker") if w in leased]
            if workers:
                victim = self.rng.choice(sorted(workers))
                out = self._stop_until_reaped(victim, (victim,), limit_s=6 * self.grace_s)
                if "skipped" not in out:
                    break
            time.sleep(0.1)
        return out

    def pg_restart(self) -> dict[str, Any]:
        self.cluster.restart()
        return {}

    def outage(self) -> dict[str, Any]:
        self.proxy.cut()
        time.sleep(self.outage_s)  # the fault itself: the database is away this long
        self.proxy.restore()
        return {"outage_s": self.outage_s}

    def disk_full(self) -> dict[str, Any]:
        filler = self.disk / "filler"
        with open(filler, "wb", buffering=0) as f:  # unbuffered: nothing left to write (and fail) on close
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
            except OSError:
                pass
        t = time.monotonic()
        mark = self.log.stat().st_size
        while time.monotonic() - t < 90 and "paused" not in self.log.read_bytes()[mark:].decode(errors="replace"):
            time.sleep(0.2)
        paused = "paused" in self.log.read_bytes()[mark:].decode(errors="replace")
        filler.unlink()
        return {"full_s": round(time.monotonic() - t, 1), "a_worker_paused": paused}

    def _stop_until_reaped(self, victim: int, owners: tuple[int, ...], limit_s: float | None = None) -> dict[str, Any]:
        """SIGSTOP `victim` until a lease that one of `owners` (pids; 0: an ownerless lease) held when it stopped is
        reaped (at most `limit_s`, default 10 x grace_s + 60 s), then SIGCONT."""
        os.kill(victim, signal.SIGSTOP)
        t = time.monotonic()
        held = [
            int(r[0])
            for r in _query(
                self.direct,
                "SELECT trial_id FROM tuner_leases WHERE state = 'running' AND pid = ANY(%s)",
                (list(owners),),
            )
        ]
        reaped = False
        while held and not reaped and time.monotonic() - t < (limit_s or 10 * self.grace_s + 60):
            time.sleep(0.2)
            reaped = bool(
                _query(
                    self.direct,
                    "SELECT count(*) FROM tuner_leases WHERE state = 'reaped' AND trial_id = ANY(%s)",
                    (held,),
                )[0][0]
            )
        os.kill(victim, signal.SIGCONT)
        out = {"pid": victim, "stopped_s": round(time.monotonic() - t, 1), "reaped_while_stopped": reaped}
        return out if held else {**out, "skipped": "it held no trial when it stopped"}

    def stop_baseline(self) -> dict[str, Any]:
        """SIGSTOP the worker of trial 0 (the baseline, which the others pair with) until it is reaped."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            rows = _query(
                self.direct,
                "SELECT l.pid FROM tuner_leases l JOIN trials t ON t.trial_id = l.trial_id "
                "WHERE t.number = 0 AND l.state = 'running' AND l.pid > 0",
            )
            if rows:
                return self._stop_until_reaped(int(rows[0][0]), (int(rows[0][0]),))
            time.sleep(0.1)
        return {"skipped": "trial 0 was never leased"}

    def stop_in_lock(self) -> dict[str, Any]:
        """SIGSTOP a worker while it holds the study lock and a trial (inside reserve or tell) until that trial is
        reaped."""
        key = lock_key(f"route-tuner:chaos-{self.seed}")
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            rows = _query(
                self.direct,
                "SELECT a.client_port FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s AND l.objid = %s",
                ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
            )
            pid = _owner_of_port(self.proxy.clients.get(int(rows[0][0]), -1)) if rows and rows[0][0] else None
            if (
                pid is not None
                and pid in self.workers_now()
                and _query(
                    self.direct, "SELECT count(*) FROM tuner_leases WHERE pid = %s AND state = 'running'", (pid,)
                )[0][0]
            ):
                return self._stop_until_reaped(pid, (pid,))  # it holds a trial: after asking for it, or telling it
            time.sleep(0.02)
        return {"skipped": "no worker with a trial was seen holding the study lock"}

    def commit_drops(self) -> dict[str, Any]:
        """Break the connection after the next COMMIT of each lifecycle step (which fired is measured at the end)."""
        self.watch.drop_after_commit(*STEPS)
        return {"armed": list(STEPS)}

    def _freeze(self, seconds: float, sigterm: bool) -> dict[str, Any]:
        pids = signal_each(self.cluster.pids(), signal.SIGSTOP)
        t = time.monotonic()
        detail: dict[str, Any] = {"frozen_s": seconds, "processes": len(pids)}
        try:
            if sigterm:
                time.sleep(seconds / 4)  # the fault: the cluster stays frozen, the run's waits are in flight
                run = self.proc
                sent = time.monotonic()
                run.send_signal(signal.SIGTERM)
                try:
                    detail["exit"] = run.wait(timeout=max(seconds - (sent - t), SIGTERM_LIMIT_S * 2))
                    detail["sigterm_answered_s"] = round(time.monotonic() - sent, 1)
                except subprocess.TimeoutExpired:
                    detail["sigterm_answered_s"] = None  # not answered while frozen: killed
                    run.kill()
            time.sleep(max(0.0, seconds - (time.monotonic() - t)))  # the rest of the freeze
        finally:
            signal_each(pids, signal.SIGCONT)
        return detail

    def freeze_short(self) -> dict[str, Any]:
        return self._freeze(FREEZE_SHORT_S, sigterm=False)

    def freeze_long_sigterm(self) -> dict[str, Any]:
        return self._freeze(FREEZE_LONG_S, sigterm=True)

    def partition_host(self) -> dict[str, Any]:
        """Start a second host on the study; cut its link in the middle of one of its tells, then restore it."""
        made = _netns_up(self.seed)
        if made:
            return {"skipped": f"network namespaces could not be made here: {made}"}
        host_ip, peer_ip = _netns_addresses(self.seed)
        self.other_watch = Watch()
        self.other_proxy = TcpProxy(self.cluster.port, host=host_ip, watch=self.other_watch)
        self.other_proxy.start()
        url = f"postgresql://postgres@{host_ip}:{self.other_proxy.port}/chaos"
        script = (
            f"hostname chaos-{self.seed}-b && exec {sys.executable} -m tuner run {self.spec} --no-confirm --workers 1 "
            f"--storage {url}"
        )
        with open(self.root / "other-host.log", "ab") as f:
            self.other = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    _netns(self.seed),
                    "unshare",
                    "--uts",
                    "--pid",
                    "--fork",
                    "--kill-child",  # the host's processes end with the benchmark, also when it is killed
                    "--mount-proc",
                    "sh",
                    "-c",
                    script,
                ],
                stdout=f,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env={**self.env, "TUNER_LOCK_DIR": str(self.root / "locks-b")},
            )
        cut = threading.Event()
        times: dict[str, float] = {}

        def partition() -> None:
            times["cut"] = time.monotonic()
            _link(self.seed, "down")
            cut.set()
            time.sleep(20)  # the partition lasts this long
            _link(self.seed, "up")
            times["restored"] = time.monotonic()

        self.other_watch.on_statement("tell", partition)
        happened = cut.wait(timeout=WAIT_S)
        while happened and "restored" not in times:
            time.sleep(0.2)
        return {
            "partitioned_in_a_tell": happened,
            "partition_s": round(times["restored"] - times["cut"], 1) if happened else None,
        }

    def squat_locks(self) -> dict[str, Any]:
        """Another local user opens and flocks every timing lock file it can, for a while."""
        if subprocess.run(["id", SQUATTER], capture_output=True).returncode != 0:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SQUATTER], check=True
            )
        code = (
            "import fcntl, os, sys, time\n"
            "d, end, held = sys.argv[1], time.monotonic() + float(sys.argv[2]), {}\n"
            "while time.monotonic() < end:\n"
            "    try: names = os.listdir(d)\n"
            "    except OSError: names = []\n"
            "    for n in names:\n"
            "        if n in held: continue\n"
            "        try:\n"
            "            fd = os.open(os.path.join(d, n), os.O_RDONLY | os.O_NOFOLLOW)\n"
            "            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB); held[n] = fd\n"
            "        except OSError: pass\n"
            "    time.sleep(0.2)\n"
            "print(len(held))\n"
        )
        before = self.timeouts()
        python = "/usr/bin/python3"  # the system's: another user cannot run a virtual environment under /root
        done = subprocess.run(
            ["runuser", "-u", SQUATTER, "--", python, "-c", code, self.env["TUNER_LOCK_DIR"], "30"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            return {"skipped": f"the squatter did not run: {done.stderr.strip()[-200:]}"}
        return {"files_held": int(done.stdout.strip()), "timeouts_meanwhile": self.timeouts() - before}

    def gc_during_racing(self) -> dict[str, Any]:
        """`tuner gc --yes` while a leader is being re-measured (or, if none is within a minute, while the study
        runs)."""
        deadline = time.monotonic() + 60
        claimed = False
        while not claimed and time.monotonic() < deadline:
            rows = _query(self.direct, "SELECT value_json FROM study_user_attributes WHERE key = 'racing'")
            claimed = any('"claim": {' in r[0] for r in rows)
            time.sleep(0.1)
        done = subprocess.run(
            [sys.executable, "-m", "tuner", "gc", str(self.spec), "--storage", self.url, "--yes"],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=self.env,
            timeout=600,
        )
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        return {"during_a_claim": claimed, "exit": done.returncode, "said": last[0][:200]}

    def two_confirmations(self) -> dict[str, Any]:
        """Two `tuner run`s of the finished study confirm at once (held at the lock until both wait for it)."""
        key = lock_key(f"route-tuner-confirm:chaos-{self.seed}")
        holder = psycopg2.connect(self.direct)
        holder.autocommit = True
        with holder.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(%s)", (key,))
        procs = [self.start_run("--confirm-top-k", "1", "--confirm-rounds", "6", confirm=True) for _ in range(2)]
        deadline = time.monotonic() + 300
        waiting = 0
        while waiting < 2 and time.monotonic() < deadline and all(p.poll() is None for p in procs):
            with holder.cursor() as cur:
                cur.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = %s AND "
                    "objid = %s",
                    ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
                )
                waiting = int(cur.fetchone()[0])
            time.sleep(0.1)
        with holder.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock(%s)", (key,))
        holder.close()
        exits = [p.wait(timeout=900) for p in procs]
        measured = _query(
            self.direct, "SELECT count(DISTINCT result_key) FROM tuner_measurements WHERE kind = 'confirm'"
        )[0][0]
        return {"both_waited": waiting >= 2, "exits": exits, "confirmations_measured": int(measured)}

    def timeouts(self) -> int:
        return int(
            _query(
                self.direct,
                "SELECT count(*) FROM trial_user_attributes WHERE key = 'failure_class' AND value_json = '\"timeout\"'",
            )[0][0]
        )

    # -- what it left behind -------------------------------------------------------------------

    def counted_and_pending(self) -> tuple[int, int]:
        rows = _query(
            self.direct,
            """
            SELECT t.state, a.value_json FROM trials t
            LEFT JOIN trial_user_attributes a ON a.trial_id = t.trial_id AND a.key = 'failure_class'""",
        )
        uncounted = {'"interrupted"', '"lost"', '"environment-error"'}
        counted = sum(
            1 for state, fc in rows if state in ("COMPLETE", "PRUNED") or (state == "FAIL" and fc not in uncounted)
        )
        pending = sum(1 for state, _ in rows if state in ("RUNNING", "WAITING"))
        return counted, pending

    def measure(self) -> dict[str, Any]:
        rows = _query(
            self.direct,
            """
            SELECT t.number, t.state,
                   (SELECT value_json FROM trial_user_attributes a
                    WHERE a.trial_id = t.trial_id AND a.key = 'failure_class'),
                   (SELECT json_object_agg(param_name, param_value) FROM trial_params p WHERE p.trial_id = t.trial_id),
                   (SELECT value_json FROM trial_system_attributes s
                    WHERE s.trial_id = t.trial_id AND s.key = 'fixed_params'),
                   (SELECT value_json FROM trial_user_attributes a
                    WHERE a.trial_id = t.trial_id AND a.key = 'cache_hit'),
                   (SELECT value_json FROM trial_user_attributes a
                    WHERE a.trial_id = t.trial_id AND a.key = 'retry_of'),
                   (SELECT value_json FROM trial_user_attributes a
                    WHERE a.trial_id = t.trial_id AND a.key = 'env_requeues'),
                   (SELECT value_json FROM trial_user_attributes a
                    WHERE a.trial_id = t.trial_id AND a.key = 'message')
            FROM trials t ORDER BY t.number""",
        )
        trials = []
        for number, state, fc, params, fixed, hit, retry_of, env_requeues, message in rows:
            route = json.dumps(params or (json.loads(fixed) if fixed else {}), sort_keys=True)
            trials.append(
                {
                    "number": number,
                    "state": state,
                    "class": json.loads(fc) if fc else "",
                    "route": route,
                    "cache_hit": hit == "true",
                    "retry_of": json.loads(retry_of) if retry_of else None,
                    "env_requeues": json.loads(env_requeues) if env_requeues else 0,
                    "message": json.loads(message) if message else "",
                }
            )
        uncounted = {"interrupted", "lost", "environment-error"}
        counted = [
            t
            for t in trials
            if t["state"] in ("COMPLETE", "PRUNED") or (t["state"] == "FAIL" and t["class"] not in uncounted)
        ]
        counted_routes = [t["route"] for t in counted]
        built = [t["route"] for t in counted if not t["cache_hit"]]  # a cache hit reuses a result: no build
        requeued = [t for t in trials if t["state"] == "FAIL" and t["class"] in uncounted]
        lost, given_up = _unresolved(trials, counted, requeued)
        cache = _query(self.direct, "SELECT status, result->>'message' FROM tuner_results")
        builds = [json.loads(p.read_text()) for p in self.build_log.glob("*.json")]
        overlaps = _concurrent_duplicates(builds, self.build_s, self.killed_children())
        orphans = [cmd for _, _, cmd in _procs() if str(self.spec) in cmd or str(self.disk) in cmd]
        kills = [f for f in self.faults if f["fault"] == "kill_worker" and "children_left" in f]
        lost_routes = [t["route"] for t in trials if t["class"] == "lost" and t["route"] != "{}"]
        duplicate_rows = _query(
            self.direct,
            """
            SELECT count(*) - count(DISTINCT (study, trial_number, kind, md5(samples_ms::text), md5(stats::text)))
            FROM tuner_measurements""",
        )[0][0]
        stops = [f for f in self.faults if "reaped_while_stopped" in f and "skipped" not in f]
        sigterms = [f for f in self.faults if f["fault"] == "freeze_long_sigterm" and "skipped" not in f]
        return {
            "seed": self.seed,
            "outage_s": self.outage_s,
            "budget": self.budget,
            "workers": self.workers,
            "faults_injected": sum(1 for f in self.faults if "skipped" not in f),
            "faults": self.faults,
            "trials_total": len(trials),
            "trials_counted": len(counted),
            "budget_exact": len(counted) == self.budget,
            "trials_lost": len(lost),
            "lost": [{k: t[k] for k in ("number", "class", "route", "message")} for t in lost],
            "routes_given_up_after_environment_errors": len(given_up),
            "trials_left_running": sum(1 for t in trials if t["state"] in ("RUNNING", "WAITING")),
            "routes_built_twice": len(built) - len(set(built)),
            "duplicates": [
                [t["number"], t["state"], t["class"], t["cache_hit"]]
                for t in counted
                if counted_routes.count(t["route"]) > 1
            ],
            "cache_hits": sum(1 for t in counted if t["cache_hit"]),
            "concurrent_duplicate_builds": len(overlaps),
            "overlapping_builds": overlaps,
            "builds": len(builds),
            "orphans_after_run": len(orphans),
            "children_alive_5s_after_worker_kill": sum(f["children_left"] for f in kills)
            + sum(1 for f in kills if f["children_gone_after_s"] > 5),
            "cached_environment_errors": sum(
                1 for status, msg in cache if status == "environment-error" or ENV_PATTERN.search(msg or "")
            ),
            "requeued": {c: sum(1 for t in requeued if t["class"] == c) for c in sorted(uncounted)},
            "duplicate_measurement_rows": int(duplicate_rows),
            "reaped_while_stopped": bool(stops) and all(f["reaped_while_stopped"] for f in stops),
            "sigterm_under_frozen_db_s": [f.get("sigterm_answered_s") for f in sigterms],
            "sigterm_answered_within_15s": bool(sigterms)
            and all((f.get("sigterm_answered_s") or 1e9) <= SIGTERM_LIMIT_S for f in sigterms),
            "commit_drops": sorted(self.watch.dropped),
            "fault_kinds": sorted({f["fault"] for f in self.faults if "skipped" not in f}),
            "waste": {
                "budget_on_timeouts": sum(1 for t in counted if t["class"] == "timeout"),
                "routes_lost_more_than_once": sum(1 for r in set(lost_routes) if lost_routes.count(r) > 1),
            },
        }


def _unresolved(
    trials: list[dict[str, Any]], counted: list[dict[str, Any]], requeued: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The uncounted trials whose chain of re-runs (trials whose `retry_of` names them, and theirs) never reached a
    counted end: (lost, given up on purpose after ENV_REQUEUES environment re-queues, not re-queued by design)."""
    done = {t["number"] for t in counted}
    reruns: dict[int, list[int]] = {}
    for t in trials:
        if t["retry_of"] is not None:
            reruns.setdefault(int(t["retry_of"]), []).append(t["number"])

    def resolved(number: int) -> bool:
        return number in done or any(resolved(n) for n in reruns.get(number, []))

    open_ = [  # a trial lost before it sampled a route has nothing to run again (the sampler proposes afresh)
        t for t in requeued if t["route"] != "{}" and not resolved(t["number"]) and not reruns.get(t["number"])
    ]
    given_up = [t for t in open_ if t["class"] == "environment-error" and t["env_requeues"] >= ENV_REQUEUES]
    return [t for t in open_ if t not in given_up], given_up


def _concurrent_duplicates(
    builds: list[dict[str, Any]], build_s: float, killed: dict[int, float]
) -> list[list[dict[str, Any]]]:
    """The pairs of builds of one route that overlapped in time. A build without an end was killed: it ended when its
    process was killed (`killed`: pid -> Unix time by which it was gone) or, where that is not known, build_s after
    it began."""
    by_route: dict[str, list[dict[str, Any]]] = {}
    for b in builds:
        span = {"pid": b["pid"], "start": b["start"], "end": b.get("end") or killed.get(b["pid"], b["start"] + build_s)}
        by_route.setdefault(json.dumps(b["route"], sort_keys=True), []).append(span)
    pairs = []
    for spans in by_route.values():
        spans.sort(key=lambda span: span["start"])
        pairs += [[a, b] for i, a in enumerate(spans) for b in spans[i + 1 :] if b["start"] < a["end"]]
    return pairs


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def machine_state() -> dict[str, Any]:
    """Load average and CPU clocks now."""
    mhz = [float(m) for m in re.findall(r"cpu MHz\s*:\s*([\d.]+)", Path("/proc/cpuinfo").read_text())]
    return {
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "cpu_mhz": [round(m) for m in mhz],
        "cores": os.cpu_count(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


TABLE = (
    ("faults injected", "faults_injected"),
    ("trials lost", "trials_lost"),
    ("trials left RUNNING/WAITING", "trials_left_running"),
    ("routes built twice (counted, not cache hits)", "routes_built_twice"),
    ("overlapping builds of one route", "concurrent_duplicate_builds"),
    ("orphan processes after the run", "orphans_after_run"),
    ("children alive 5 s after their worker's SIGKILL", "children_alive_5s_after_worker_kill"),
    ("budget exact", "budget_exact"),
    ("cached environment errors", "cached_environment_errors"),
    ("duplicate measurement rows", "duplicate_measurement_rows"),
    ("stopped workers reaped while stopped", "reaped_while_stopped"),
    ("SIGTERM under a frozen database answered within 15 s", "sigterm_answered_within_15s"),
    ("first run's exit status", "first_run_exit"),
    ("routes given up after repeated environment errors", "routes_given_up_after_environment_errors"),
    ("budget spent on timeouts", "waste.budget_on_timeouts"),
    ("routes lost more than once", "waste.routes_lost_more_than_once"),
    ("time to finish against a fault-free run", "waste.time_vs_fault_free"),
)


def _cell(row: dict[str, Any], key: str) -> str:
    """One table cell: `key` (dotted for a nested one) of a seed's row."""
    value: Any = row
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return ("yes" if value else "no") if isinstance(value, bool) else "-" if value is None else str(value)


def table(doc: dict[str, Any]) -> str:
    """The docs/benchmarks.md table: one column per seed."""
    seeds = doc["seeds"]
    head = "| | " + " | ".join(f"seed {s['seed']} ({s['outage_s']:g} s outage)" for s in seeds) + " |"
    rows = [head, "|---" * (len(seeds) + 1) + "|"]
    for label, key in TABLE:
        rows.append(f"| {label} | " + " | ".join(_cell(s, key) for s in seeds) + " |")
    return "\n".join(rows)


def _run_seed(args: argparse.Namespace, **schedule: tuple[str, ...]) -> dict[str, Any]:
    """One run of the seed's study with the given faults, on a cluster and tmpfs of its own."""
    with tempfile.TemporaryDirectory(prefix=f"chaos-{args.seed}-") as d:
        root = Path(d)
        os.chmod(root, 0o755)
        seed = Seed(args.seed, args.outage_s, args.budget, args.workers, args.build_s, args.grace_s, root, **schedule)
        seed.setup()
        try:
            return seed.run()
        finally:
            seed.teardown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", action="store_true", help="only print the docs/benchmarks.md table of the results file")
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--outage-s", type=float, default=360.0, help="the long outage (6 minutes: past the old 5-minute retry window)"
    )
    p.add_argument("--budget", type=int, default=60)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--build-s", type=float, default=2.0)
    p.add_argument("--grace-s", type=float, default=8.0)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument(
        "--no-fault-free",
        dest="fault_free",
        action="store_false",
        help="skip the fault-free run of the same seed (the reference of the time to finish)",
    )
    args = p.parse_args()
    if args.table:
        print(table(json.loads(args.out.read_text())))
        return
    if args.seed is None:
        p.error("--seed is required")
    signal.signal(signal.SIGTERM, _interrupt)  # so a stopped benchmark still unmounts and stops its cluster
    before = machine_state()
    reference = _run_seed(args, schedule=(), first=(), last=()) if args.fault_free else None
    row = _run_seed(args, schedule=FAULTS, first=FIRST, last=LAST)
    if reference is not None:
        row["waste"]["fault_free_wall_s"] = reference["wall_s"]
        row["waste"]["time_vs_fault_free"] = round(row["wall_s"] / reference["wall_s"], 2)
    row["machine_before"], row["machine_after"] = before, machine_state()
    row["commit"] = commit()
    doc = json.loads(args.out.read_text()) if args.out.exists() else {"benchmark": "chaos", "seeds": []}
    doc["seeds"] = [s for s in doc["seeds"] if s["seed"] != args.seed] + [row]
    doc["seeds"].sort(key=lambda s: s["seed"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    keys = (
        "faults_injected",
        "trials_lost",
        "lost",
        "routes_given_up_after_environment_errors",
        "trials_left_running",
        "routes_built_twice",
        "concurrent_duplicate_builds",
        "orphans_after_run",
        "children_alive_5s_after_worker_kill",
        "budget_exact",
        "cached_environment_errors",
        "duplicate_measurement_rows",
        "reaped_while_stopped",
        "sigterm_answered_within_15s",
        "fault_kinds",
        "waste",
    )
    print(json.dumps({k: row[k] for k in keys}))


if __name__ == "__main__":
    main()
