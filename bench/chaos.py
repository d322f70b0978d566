"""Chaos benchmark: a PostgreSQL study with 4 workers on fixed-cost builds and a seeded schedule of faults.

Faults, in a seeded order, each when a seeded number of trials has finished: SIGKILL of a random
worker (x2) and of a random trial child (x3), SIGSTOP of a worker until its trial is reaped (past
`grace_s`) then SIGCONT, a real PostgreSQL restart, a long database outage, and a full work dir.
Then the study is resumed (`tuner run` again) until its budget is spent, and the database, the
build log and the process table are checked.

The study runs on a private PostgreSQL cluster (initdb in a temporary directory, its own port), so it
can be restarted without touching the shared one; the outage is a TCP proxy on 127.0.0.1 that is cut
and restored (tests/proxy.py). The work dir is a small tmpfs (mounted here; needs root).

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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.errors

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import to_toml  # noqa: E402
from tests.models import conv_model  # noqa: E402
from tests.proxy import TcpProxy  # noqa: E402

PG_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1] if Path("/usr/lib/postgresql").exists() else Path("/usr/bin")
FAULTS = ("kill_worker", "kill_worker", "kill_child", "kill_child", "kill_child", "stop_worker", "pg_restart", "outage", "disk_full")
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
        subprocess.run(["runuser", "-u", "postgres", "--", *cmd], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=180)

    def start(self) -> None:
        """initdb (trust auth) and start."""
        shutil.chown(self.root, "postgres")
        self._as_postgres(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust")
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"), "-w",
                          "-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200", "start")

    def restart(self) -> None:
        """A real server restart: every connection is dropped."""
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-m", "fast", "restart")

    def stop(self) -> None:
        """Stop the server (the data directory goes with the temporary directory)."""
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-w", "-m", "immediate", "stop")

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
        except (psycopg2.OperationalError, psycopg2.errors.UndefinedTable):  # restarting, or `tuner run` still setting up
            time.sleep(0.5)
    raise RuntimeError("the private cluster did not answer")


def _procs() -> list[tuple[int, int, str]]:
    """(pid, ppid, command line) of every process."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if stat[0] != "Z":
                out.append((int(entry.name), int(stat[1]), cmd))
    return out


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
    timing_cap_s: float | None = None  # None: the tuner's default cap (what the recorded seeds ran with)
    faults: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cluster = PrivateCluster(self.root / "pg")
        self.disk = self.root / "disk"
        self.spec = self.root / "chaos.toml"
        self.build_log = self.root / "builds"
        self.log = self.root / "run.log"
        self.rng = random.Random(self.seed)

    # -- set-up ------------------------------------------------------------------------------

    def setup(self) -> None:
        (self.root / "pg").mkdir()
        self.cluster.start()
        self.cluster.create("chaos")
        self.direct = self.cluster.url("chaos")
        self.proxy = TcpProxy(self.cluster.port)
        self.proxy.start()
        self.url = self.cluster.url("chaos", self.proxy.port)
        self.disk.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(self.disk)], check=True)
        self.build_log.mkdir()
        conv_model(self.root / "tiny.onnx")
        self.spec.write_text(to_toml({
            "study": {"name": f"chaos-{self.seed}", "work_dir": str(self.disk / "work")},
            "model": {"path": str(self.root / "tiny.onnx")},
            "data": {"samples": 2, "gate_samples": 1},
            "accuracy": {"metric": "max_abs", "tolerance": 1e-3},
            "objective": {"warmup_s": 0.0, "min_repeats": 3, "min_duration_s": 0.0,
                          **({"timing_cap_s": self.timing_cap_s} if self.timing_cap_s is not None else {})},
            "backend": {"name": "bench.fixed_cost:LoggedFixedCostBackend",
                        "options": {"build_s": self.build_s, "build_log": str(self.build_log)}},
            "run": {"budget": self.budget, "workers": self.workers, "sampler": "random", "seed": self.seed,
                    "heartbeat_s": 1.0, "grace_s": self.grace_s, "trial_timeout_s": 120.0},
        }))

    def teardown(self) -> None:
        self.proxy.cut()
        subprocess.run(["umount", "-l", str(self.disk)], check=False)
        self.cluster.stop()

    # -- the run -----------------------------------------------------------------------------

    def start_run(self) -> subprocess.Popen[bytes]:
        with open(self.log, "ab") as f:
            return subprocess.Popen([sys.executable, "-m", "tuner", "run", str(self.spec), "--storage", self.url, "--no-confirm"],
                                    stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
                                    env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"})

    def finished(self) -> int:
        return int(_query(self.direct, "SELECT count(*) FROM trials WHERE state IN ('COMPLETE', 'PRUNED', 'FAIL')")[0][0])

    def workers_now(self) -> list[int]:
        return [pid for pid, _, cmd in _procs() if "tuner.worker.main" in cmd and str(self.spec) in cmd]

    def children_now(self) -> list[tuple[int, int]]:
        return [(pid, ppid) for pid, ppid, cmd in _procs() if "tuner.worker.child" in cmd and str(self.disk) in cmd]

    def run(self) -> dict[str, Any]:
        """Run the study under the fault schedule, resume it, and measure."""
        order = self.rng.sample(self.schedule, len(self.schedule))
        triggers = sorted(self.rng.sample(range(2, self.budget - len(self.schedule) // 2 - 2), len(self.schedule)))
        t0 = time.monotonic()
        proc = self.start_run()
        try:
            self.inject(proc, order, triggers, t0)
        finally:
            if proc.poll() is None and sys.exc_info()[0] is not None:
                proc.kill()
        first_rc = proc.wait()
        resumes = []
        for _ in range(5):
            counted, pending = self.counted_and_pending()
            if counted >= self.budget and not pending:
                break
            rc = self.start_run().wait()
            resumes.append(rc)
        wall = time.monotonic() - t0
        return {**self.measure(), "first_run_exit": first_rc, "resume_exits": resumes, "wall_s": round(wall, 1)}

    def inject(self, proc: subprocess.Popen[bytes], order: list[str], triggers: list[int], t0: float) -> None:
        """Each fault in turn, once its number of trials has finished (skipped if the run ended first)."""
        for name, at in zip(order, triggers):
            while self.finished() < at and proc.poll() is None:
                time.sleep(0.2)  # polling the study's progress: faults are scheduled by trial count
            if proc.poll() is not None:
                self.faults.append({"fault": name, "at_trials": at, "skipped": "the run had ended"})
                continue
            started = time.monotonic()
            detail = getattr(self, name)()
            self.faults.append({"fault": name, "at_trials": at, "t_s": round(started - t0, 1),
                                "duration_s": round(time.monotonic() - started, 1), **detail})
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
        parents = sorted({ppid for _, ppid in self._wait_for("child", 30)} & set(self.workers_now()))
        workers = parents or self._wait_for("worker")  # one in the middle of a trial, where there is one
        if not workers:
            return {"skipped": "no worker"}
        victim = self.rng.choice(sorted(workers))
        kids = [pid for pid, ppid in self.children_now() if ppid == victim]
        os.kill(victim, signal.SIGKILL)
        t = time.monotonic()
        while any(pid in {p for p, _, _ in _procs()} for pid in kids) and time.monotonic() - t < 10:
            time.sleep(0.05)
        alive = [pid for pid in kids if pid in {p for p, _, _ in _procs()}]
        return {"pid": victim, "children": len(kids), "children_gone_after_s": round(time.monotonic() - t, 2), "children_left": len(alive)}

    def kill_child(self) -> dict[str, Any]:
        children = self._wait_for("child")
        if not children:
            return {"skipped": "no child"}
        pid, ppid = self.rng.choice(sorted(children))
        os.kill(pid, signal.SIGKILL)
        return {"pid": pid, "worker": ppid}

    def stop_worker(self) -> dict[str, Any]:
        leased = {int(r[0]) for r in _query(self.direct, "SELECT pid FROM tuner_leases WHERE state = 'running'")}
        workers = [w for w in self._wait_for("worker") if w in leased] or self._wait_for("worker")
        if not workers:
            return {"skipped": "no worker"}
        victim = self.rng.choice(sorted(workers))
        os.kill(victim, signal.SIGSTOP)
        t = time.monotonic()
        reaped = False
        while time.monotonic() - t < 6 * self.grace_s:
            rows = _query(self.direct, "SELECT count(*) FROM tuner_leases WHERE pid = %s AND state = 'reaped'", (victim,))
            if rows[0][0]:
                reaped = True
                break
            time.sleep(0.2)
        os.kill(victim, signal.SIGCONT)
        return {"pid": victim, "stopped_s": round(time.monotonic() - t, 1), "reaped_while_stopped": reaped}

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

    # -- what it left behind -------------------------------------------------------------------

    def counted_and_pending(self) -> tuple[int, int]:
        rows = _query(self.direct, """
            SELECT t.state, a.value_json FROM trials t
            LEFT JOIN trial_user_attributes a ON a.trial_id = t.trial_id AND a.key = 'failure_class'""")
        uncounted = {'"interrupted"', '"lost"', '"environment-error"'}
        counted = sum(1 for state, fc in rows if state in ("COMPLETE", "PRUNED") or (state == "FAIL" and fc not in uncounted))
        pending = sum(1 for state, _ in rows if state in ("RUNNING", "WAITING"))
        return counted, pending

    def measure(self) -> dict[str, Any]:
        rows = _query(self.direct, """
            SELECT t.number, t.state,
                   (SELECT value_json FROM trial_user_attributes a WHERE a.trial_id = t.trial_id AND a.key = 'failure_class'),
                   (SELECT json_object_agg(param_name, param_value) FROM trial_params p WHERE p.trial_id = t.trial_id),
                   (SELECT value_json FROM trial_system_attributes s WHERE s.trial_id = t.trial_id AND s.key = 'fixed_params'),
                   (SELECT value_json FROM trial_user_attributes a WHERE a.trial_id = t.trial_id AND a.key = 'cache_hit')
            FROM trials t ORDER BY t.number""")
        trials = []
        for number, state, fc, params, fixed, hit in rows:
            route = json.dumps(params or (json.loads(fixed) if fixed else {}), sort_keys=True)
            trials.append({"number": number, "state": state, "class": json.loads(fc) if fc else "", "route": route,
                           "cache_hit": hit == "true"})
        uncounted = {"interrupted", "lost", "environment-error"}
        counted = [t for t in trials if t["state"] in ("COMPLETE", "PRUNED") or (t["state"] == "FAIL" and t["class"] not in uncounted)]
        counted_routes = [t["route"] for t in counted]
        built = [t["route"] for t in counted if not t["cache_hit"]]  # a cache hit reuses a result: no build
        requeued = [t for t in trials if t["state"] == "FAIL" and t["class"] in uncounted]
        lost = [t for t in requeued if t["route"] != "{}" and t["route"] not in counted_routes]
        cache = _query(self.direct, "SELECT status, result->>'message' FROM tuner_results")
        builds = [json.loads(p.read_text()) for p in self.build_log.glob("*.json")]
        orphans = [cmd for _, _, cmd in _procs() if str(self.spec) in cmd or str(self.disk) in cmd]
        kills = [f for f in self.faults if f["fault"] == "kill_worker" and "children_left" in f]
        return {
            "seed": self.seed, "outage_s": self.outage_s, "budget": self.budget, "workers": self.workers,
            "faults_injected": sum(1 for f in self.faults if "skipped" not in f), "faults": self.faults,
            "trials_total": len(trials), "trials_counted": len(counted), "budget_exact": len(counted) == self.budget,
            "trials_lost": len(lost), "trials_left_running": sum(1 for t in trials if t["state"] in ("RUNNING", "WAITING")),
            "routes_built_twice": len(built) - len(set(built)),
            "duplicates": [[t["number"], t["state"], t["class"], t["cache_hit"]] for t in counted if counted_routes.count(t["route"]) > 1],
            "cache_hits": sum(1 for t in counted if t["cache_hit"]),
            "concurrent_duplicate_builds": _concurrent_duplicates(builds, self.build_s),
            "builds": len(builds), "orphans_after_run": len(orphans),
            "children_alive_5s_after_worker_kill": sum(f["children_left"] for f in kills)
            + sum(1 for f in kills if f["children_gone_after_s"] > 5),
            "cached_environment_errors": sum(1 for status, msg in cache if status == "environment-error" or ENV_PATTERN.search(msg or "")),
            "requeued": {c: sum(1 for t in requeued if t["class"] == c) for c in sorted(uncounted)},
        }


def _concurrent_duplicates(builds: list[dict[str, Any]], build_s: float) -> int:
    """Pairs of builds of one route that overlapped in time (a killed build counts as lasting build_s)."""
    by_route: dict[str, list[tuple[float, float]]] = {}
    for b in builds:
        by_route.setdefault(json.dumps(b["route"], sort_keys=True), []).append((b["start"], b.get("end") or b["start"] + build_s))
    pairs = 0
    for spans in by_route.values():
        spans.sort()
        pairs += sum(1 for i in range(len(spans)) for j in range(i + 1, len(spans)) if spans[j][0] < spans[i][1])
    return pairs


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def machine_state() -> dict[str, Any]:
    """Load average and CPU clocks now."""
    mhz = [float(m) for m in re.findall(r"cpu MHz\s*:\s*([\d.]+)", Path("/proc/cpuinfo").read_text())]
    return {"loadavg": [round(x, 2) for x in os.getloadavg()], "cpu_mhz": [round(m) for m in mhz], "cores": os.cpu_count(),
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


TABLE = (("faults injected", "faults_injected"), ("trials lost", "trials_lost"), ("trials left RUNNING/WAITING", "trials_left_running"),
         ("routes built twice (counted, not cache hits)", "routes_built_twice"), ("overlapping builds of one route", "concurrent_duplicate_builds"),
         ("orphan processes after the run", "orphans_after_run"), ("children alive 5 s after their worker's SIGKILL", "children_alive_5s_after_worker_kill"),
         ("budget exact", "budget_exact"), ("cached environment errors", "cached_environment_errors"))


def table(doc: dict[str, Any]) -> str:
    """The docs/benchmarks.md table: one column per seed."""
    seeds = doc["seeds"]
    head = "| | " + " | ".join(f"seed {s['seed']} ({s['outage_s']:g} s outage)" for s in seeds) + " |"
    rows = [head, "|---" * (len(seeds) + 1) + "|"]
    for label, key in TABLE:
        rows.append(f"| {label} | " + " | ".join(("yes" if s[key] else "no") if isinstance(s[key], bool) else str(s[key]) for s in seeds) + " |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", action="store_true", help="only print the docs/benchmarks.md table of the results file")
    p.add_argument("--seed", type=int)
    p.add_argument("--outage-s", type=float, default=360.0, help="the long outage (6 minutes: past the old 5-minute retry window)")
    p.add_argument("--budget", type=int, default=60)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--build-s", type=float, default=2.0)
    p.add_argument("--grace-s", type=float, default=8.0)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    if args.table:
        print(table(json.loads(args.out.read_text())))
        return
    if args.seed is None:
        p.error("--seed is required")
    signal.signal(signal.SIGTERM, _interrupt)  # so a stopped benchmark still unmounts and stops its cluster
    before = machine_state()
    with tempfile.TemporaryDirectory(prefix=f"chaos-{args.seed}-") as d:
        root = Path(d)
        os.chmod(root, 0o755)
        seed = Seed(args.seed, args.outage_s, args.budget, args.workers, args.build_s, args.grace_s, root)
        seed.setup()
        try:
            row = seed.run()
        finally:
            seed.teardown()
    row["machine_before"], row["machine_after"] = before, machine_state()
    doc = json.loads(args.out.read_text()) if args.out.exists() else {"benchmark": "chaos", "seeds": []}
    doc["seeds"] = [s for s in doc["seeds"] if s["seed"] != args.seed] + [row]
    doc["seeds"].sort(key=lambda s: s["seed"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    keys = ("faults_injected", "trials_lost", "trials_left_running", "routes_built_twice", "concurrent_duplicate_builds",
            "orphans_after_run", "children_alive_5s_after_worker_kill", "budget_exact", "cached_environment_errors")
    print(json.dumps({k: row[k] for k in keys}))


if __name__ == "__main__":
    main()
