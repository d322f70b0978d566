"""How long the test suite takes, end to end, and what its processes spend starting up.

1. **start-up**, side by side in one run, `--repeats` times each, alternating: the import time of
   `onnx` with ml_dtypes 0.7.0 and with 0.6.0 (each wheel unpacked into a temporary folder ahead of
   the venv's own), and the int8 preparation of a small CNN in a fresh process as it runs (PyTorch
   kept out of `onnxruntime.tools`) and with that step switched off, so that `onnxruntime.tools`
   imports torch as it did before (what every `tuner run` with int8 routes paid).
2. **suite**: the documented test command (`make test`) (`pytest -q -n N --dist loadgroup`, N from `--workers`, 0 =
   one process), command start to end, with the CPU time of all its processes (this process is their
   subreaper: one its parent left behind, such as a server left to die with its starter, is waited for
   here and counted too), the load average before and after, and pytest's summary line.

3. **then and now** (`--against COMMIT`): that commit's own test command (one process, or `--workers` pytest-xdist
   workers where its Makefile ran them) in a temporary worktree of it, and today's test command on the tests that
   existed then
   (the test functions of that commit still present by name), alternating `--rounds` times, so
   both are measured close together in time on the same machine, interpreter and libraries (the old
   tree's `migrations/` is linked as `tuner/migrations`, where its wheel installs it). The pair it replaces under
   `then_and_now[COMMIT]` is kept as `then_and_now["COMMIT-against-ITS_NOW_COMMIT"]`.

Writes bench/results/test-suite.json (runs keyed by commit and worker count, merged with earlier keys; failed
tests by name; a top-level `latest` with the wall and CPU seconds and the commit of the last run of the
documented command, `make test`'s worker count) and each run's output to $TMPDIR/suite-time.log-N.
4. **whole suites** (`--whole-against COMMIT`): that commit's whole suite with its own test command (`--workers`)
   in a temporary worktree, and today's whole `make test`, alternating `--rounds` times; today's runs
   are the suite runs of item 2 (the last one is `latest`). The pair it replaces under `whole_against[COMMIT]` is
   kept as `whole_against["COMMIT-against-ITS_NOW_COMMIT"]`.

Usage: python bench/suite_time.py [--workers 3 0] [--repeats 5] [--skip-startup]
       [--against e6d79eb --rounds 2 [--deselect TEST ...]] [--whole-against db1136d --rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import commit, describe  # noqa: E402
from bench.wheels import download  # noqa: E402

OUT = REPO / "bench" / "results" / "test-suite.json"
LOG = Path(tempfile.gettempdir()) / "suite-time.log"  # each run's full output, as suite-time.log-N
ML_DTYPES = ("0.7.0", "0.6.0")
PREPARE = """import sys, time
from pathlib import Path
import tuner.backends.onnxruntime.prepare as preparation
if sys.argv[3] == "torch-imported":
    preparation._keep_torch_out_of_ort_tools = lambda: None  # as before: onnxruntime.tools imports torch
t0 = time.perf_counter()
preparation.prepare(Path(sys.argv[1]), "key", Path(sys.argv[2]), lambda line: None)
print(time.perf_counter() - t0, "torch" in sys.modules)
"""


def _unpacked_ml_dtypes(version: str, into: Path) -> Path:
    """ml_dtypes `version`'s wheel for this interpreter, unpacked under `into`."""
    wheel = download(f"ml_dtypes=={version}", into / "wheels" / version)
    target = into / f"ml_dtypes-{version}"
    with zipfile.ZipFile(wheel) as whl:
        whl.extractall(target)
    return target


def _onnx_import_s(path_first: Path) -> float:
    """Seconds `import onnx` takes in a fresh process with `path_first` ahead on the path (-X importtime)."""
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import onnx"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(path_first)},
    )
    last = [line for line in run.stderr.splitlines() if line.rstrip().endswith("| onnx")][-1]
    return int(last.split("|")[1]) / 1e6


def _prepare_s(model: Path, into: Path, mode: str) -> float:
    """Seconds the int8 preparation of `model` takes in a fresh process (`mode`: torch-kept-out or torch-imported)."""
    into.mkdir(parents=True)
    run = subprocess.run(
        [sys.executable, "-c", PREPARE, str(model), str(into), mode],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    seconds, torch_loaded = run.stdout.split()
    assert torch_loaded == str(mode == "torch-imported"), run.stdout  # the variant ran as named
    return float(seconds)


def startup(repeats: int) -> dict[str, Any]:
    """Import and preparation times, alternating the variants in each repeat."""
    sys.path.insert(0, str(REPO))
    from tests.models import conv_model

    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        unpacked = {v: _unpacked_ml_dtypes(v, root) for v in ML_DTYPES}
        model = conv_model(root / "tiny.onnx")
        for i in range(repeats):
            for version, path in unpacked.items():
                samples.setdefault(f"import onnx, ml_dtypes {version}", []).append(_onnx_import_s(path))
            for mode in ("torch-kept-out", "torch-imported"):
                samples.setdefault(f"int8 preparation, {mode}", []).append(
                    _prepare_s(model, root / f"prep-{mode}-{i}", mode)
                )
    return {
        name: {"median_s": round(statistics.median(v), 3), "samples_s": [round(x, 3) for x in v]}
        for name, v in samples.items()
    }


MAKE_TEST_WORKERS = 3  # the pytest-xdist workers of `make test` (Makefile)
PR_SET_CHILD_SUBREAPER = 36


def pytest_command(workers: int) -> list[str]:
    """The documented test command with `workers` pytest-xdist workers (0: one process)."""
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"] + (
        ["-n", str(workers), "--dist", "loadgroup"] if workers else []
    )


def suite(workers: int, tests: list[str] | None = None, cwd: Path = REPO, log_name: str = "") -> dict[str, Any]:
    """One run of the test command with `workers` workers in `cwd`, on `tests` (node ids) or on all of them."""
    before = describe()
    cmd = pytest_command(workers)
    start = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    log = LOG.with_name(f"{LOG.name}-{log_name or workers}")
    with open(log, "wb") as out:
        run = subprocess.Popen(cmd + (tests or []), cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        orphans = reap_orphans_while(run)
    wall = time.monotonic() - t0
    orphans += reap_orphans()
    end = resource.getrusage(resource.RUSAGE_CHILDREN)
    stdout = log.read_text(errors="replace")
    summary = [line for line in stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    return {
        "command": " ".join(["python"] + cmd[1:] + ([f"<{len(tests)} node ids>"] if tests else [])),
        "workers": workers,
        "exit": run.returncode,
        "wall_s": round(wall, 1),
        "cpu_s": round((end.ru_utime - start.ru_utime) + (end.ru_stime - start.ru_stime), 1),
        "orphans_reaped": orphans,
        "summary": summary[-1].strip("= ") if summary else stdout[-500:],
        "failed": [line.split()[1] for line in stdout.splitlines() if line.startswith("FAILED ")],
        "before": before,
        "after": describe(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


def adopt_orphans() -> None:
    """Make this process the subreaper of what it starts (Linux `PR_SET_CHILD_SUBREAPER`): a process its parent leaves
    behind (a server left to die with its starter) is re-parented here, not to init, so `reap_orphans` waits for it
    and its CPU time is counted as this process's children's."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def reap_orphans_while(proc: subprocess.Popen[bytes]) -> int:
    """Reap the processes re-parented here (`adopt_orphans`) as they end, while `proc` runs (a test that watches a
    killed process vanish must not find it a zombie waiting for this process); how many there were."""
    reaped = 0
    while proc.poll() is None:
        try:
            ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            ended = None
        if ended is not None and ended.si_pid != proc.pid:
            os.waitpid(ended.si_pid, 0)
            reaped += 1
        else:
            time.sleep(0.05)
    return reaped


def reap_orphans(grace_s: float = 15.0) -> int:
    """After the run: wait up to `grace_s` for the processes re-parented here (`adopt_orphans`) that are ending (a
    server dies with its starter); a daemon the run restarted (PostgreSQL) is left running. How many were reaped."""
    reaped, deadline = 0, time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid:
            reaped += 1
        else:
            time.sleep(0.1)
    return reaped


def collected(cwd: Path) -> list[str]:
    """The node ids pytest collects in `cwd`."""
    out = subprocess.run(
        pytest_command(0) + ["--collect-only"], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout
    return [line.strip() for line in out.splitlines() if "::" in line]


def function_name(node_id: str) -> str:
    """`tests/test_x.py::test_y[param]` -> `test_y`."""
    return node_id.split("::")[-1].split("[")[0].split("@")[0]


def own_workers(tree: Path, workers: int) -> int:
    """The worker count of the test command of the commit checked out in `tree`: `workers` where its Makefile runs
    pytest-xdist (`-n`), else 0 (one process)."""
    return workers if re.search(r"pytest\b.*\s-n\s", (tree / "Makefile").read_text()) else 0


def then_and_now(old: str, now: str, rounds: int, workers: int, deselect: list[str]) -> dict[str, Any]:
    """Commit `old`'s test command against today's (`now`: `commit()` when the command started) on the tests that
    existed at `old`, alternating.

    `deselect`: test functions left out on both sides (one that fails at `old` with today's libraries
    would count its timeout as the suite's time).
    """
    with _worktree(old) as tree:
        then_ids = [n for n in collected(tree) if function_name(n) not in deselect]
        then_names = {function_name(n) for n in then_ids}
        common = [n for n in collected(REPO) if function_name(n) in then_names]
        runs: list[dict[str, Any]] = []
        for i in range(rounds):
            order = [("then", own_workers(tree, workers), then_ids, tree), ("now", workers, common, REPO)]
            for label, n, tests, cwd in order if i % 2 == 0 else order[::-1]:
                row = {"label": label, "round": i, **suite(n, tests, cwd, f"{label}-{i}")}
                runs.append(row)
                print(
                    f"{label} (round {i}): {row['wall_s']} s wall, {row['cpu_s']} s CPU, {row['summary']}",
                    flush=True,
                )
    return {
        "then_commit": old,
        "now_commit": now,
        "deselected": deselect,
        "then_functions": len(then_names),
        "now_functions_of_then": len({function_name(n) for n in common}),
        "now_tests_of_then": len(common),
        "runs": runs,
    }


def keep_earlier(pairs: dict[str, Any], key: str) -> None:
    """Before a new pair replaces `pairs[key]`, keep the one there under "KEY-against-ITS_NOW_COMMIT" (the first
    kept of that name stays)."""
    earlier = pairs.get(key)
    if earlier is not None:
        pairs.setdefault(f"{key}-against-{earlier.get('now_commit', 'unknown')}", earlier)


def whole_against(old: str, now: str, rounds: int, workers: int) -> dict[str, Any]:
    """Commit `old`'s whole suite (its own test command, `workers` pytest-xdist workers) against today's whole suite
    (`now`: `commit()` when the command started), alternating, in one sitting: the two suites as each was run, not
    only the tests they share."""
    runs: list[dict[str, Any]] = []
    with _worktree(old) as tree:
        for i in range(rounds):
            order = [("then", tree), ("now", REPO)]
            for label, cwd in order if i % 2 == 0 else order[::-1]:
                row = {"label": label, "round": i, **suite(workers, None, cwd, f"whole-{label}-{i}")}
                runs.append(row)
                print(
                    f"{label} (round {i}): {row['wall_s']} s wall, {row['cpu_s']} s CPU, {row['summary']}", flush=True
                )
    return {"then_commit": old, "now_commit": now, "workers": workers, "runs": runs}


@contextlib.contextmanager
def _worktree(old: str) -> Iterator[Path]:
    """A temporary worktree of commit `old`, its `migrations/` linked where its wheel installs them (the venv's
    editable install maps `tuner.migrations` to today's), removed afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "then"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), old], cwd=REPO, check=True)
        if (tree / "migrations").is_dir() and not (tree / "tuner" / "migrations").exists():
            (tree / "tuner" / "migrations").symlink_to("../migrations")
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=True)


def latest(key: str, row: dict[str, Any]) -> dict[str, Any]:
    """The top-level `latest`: the last run of the documented command (`make test`'s worker count)."""
    return {k: row[k] for k in ("wall_s", "cpu_s", "exit", "when", "command")} | {"commit": key}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[3, 0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-startup", action="store_true")
    parser.add_argument(
        "--against", metavar="COMMIT", help="also time COMMIT's suite against today's on the same tests"
    )
    parser.add_argument(
        "--whole-against",
        metavar="COMMIT",
        help="time COMMIT's whole suite against today's whole suite (both with the first --workers), alternating",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--deselect", nargs="*", default=[], metavar="TEST_FUNCTION", help="with --against: left out on both sides"
    )
    args = parser.parse_args()
    adopt_orphans()
    doc = json.loads(OUT.read_text()) if OUT.exists() else {"runs": {}}
    key = commit()
    if args.against:
        name = args.against + "".join(f"-without-{t}" for t in args.deselect)
        keep_earlier(doc.setdefault("then_and_now", {}), name)
        doc["then_and_now"][name] = then_and_now(args.against, key, args.rounds, args.workers[0], args.deselect)
        OUT.write_text(json.dumps(doc, indent=1) + "\n")
    if args.whole_against:
        keep_earlier(doc.setdefault("whole_against", {}), args.whole_against)
        doc["whole_against"][args.whole_against] = whole = whole_against(
            args.whole_against, key, args.rounds, args.workers[0]
        )
        last_now = next(r for r in reversed(whole["runs"]) if r["label"] == "now")
        if args.workers[0] == MAKE_TEST_WORKERS:
            doc["latest"] = latest(key, last_now)
        OUT.write_text(json.dumps(doc, indent=1) + "\n")
    if not args.skip_startup:
        doc["startup"] = {
            "commit": key,
            "machine": describe(),
            "repeats": args.repeats,
            "figures": startup(args.repeats),
        }
        print(json.dumps(doc["startup"]["figures"], indent=1), flush=True)
    for n in [] if args.whole_against else args.workers:  # with --whole-against its "now" runs are these
        row = suite(n)
        doc["runs"][f"{key}-workers-{n}"] = row
        if n == MAKE_TEST_WORKERS:
            doc["latest"] = latest(key, row)
        print(f"{n} workers: {row['wall_s']} s wall, {row['cpu_s']} s CPU, {row['summary']}", flush=True)
        OUT.write_text(json.dumps(doc, indent=1) + "\n")
    OUT.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
