"""Exclusive timing at raised priority (tuner.measure.priority): every thread raised, restored after, recorded."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.conftest import REPO, tuner
from tests.helpers import trials
from tuner.measure.priority import TIMING_NICE, _may_raise
from tuner.study import attrs as A


def _in_child(code: str) -> str:
    """Run `code` in a fresh interpreter (priorities changed there stay there); its stdout."""
    out = subprocess.run(  # its own session, so its own autogroup, like a trial's child
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True, start_new_session=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def _session_autogroup() -> int | None:
    """A new session's autogroup nice, as a trial's child sees it (None without autogroups).

    Not this process's own: a process in the host's first session (a container's, say) reads no autogroup
    while every session started later has one.
    """
    return json.loads(
        _in_child(
            "import json; from tuner.measure.priority import _autogroup_nice; print(json.dumps(_autogroup_nice()))"
        )
    )


def test_every_thread_is_raised_for_the_block_and_each_gets_its_own_value_back() -> None:
    out = _in_child(
        """
        import json, os, threading
        from tuner.measure.priority import _autogroup_nice, raised
        def nices():
            return sorted(os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task"))
        stop = threading.Event()
        early = threading.Thread(target=stop.wait); early.start()  # started before: keeps nice 0
        os.setpriority(os.PRIO_PROCESS, 0, 3)  # the main thread's own value (Linux: per thread)
        with raised() as record:
            late = threading.Thread(target=stop.wait); late.start()  # started inside: inherits the raised value
            inside = nices(), _autogroup_nice()
        after = nices(), _autogroup_nice()
        stop.set()
        print(json.dumps([record, inside, after]))
        """
    )
    record, inside, after = json.loads(out)
    group = _session_autogroup()
    assert after == [[0, 3, 3], None if group is None else 0], out  # early 0, main 3, late back to main's 3
    if _may_raise():  # root or CAP_SYS_NICE, as in CI
        raised_group = None if group is None else TIMING_NICE
        assert record == {"raised": True, "nice": TIMING_NICE, "autogroup": raised_group}, out
        assert inside == [[-20, -20, -20], raised_group], out
    else:
        assert record["raised"] is False and inside == after, out


def test_without_permission_nothing_changes_and_the_record_says_why() -> None:
    out = _in_child(
        """
        import os, resource
        from tuner.measure.priority import raised
        if os.getuid() == 0:  # drop root (and CAP_SYS_NICE) the way an ordinary user runs
            resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
            os.setgid(65534); os.setuid(65534)
        with raised() as record:
            print(record, os.getpriority(os.PRIO_PROCESS, 0))
        """
    )
    assert out == "{'raised': False, 'nice': 0, 'why': 'not permitted (needs root, CAP_SYS_NICE or RLIMIT_NICE 40)'} 0"


def test_a_study_records_the_priority_each_timing_ran_at(write_spec, sqlite_url) -> None:
    permitted = _may_raise()
    group = _session_autogroup()
    for contention, raised_expected in (("exclusive", permitted), ("shared", False)):
        spec = write_spec(**{"objective.contention": contention, "run.budget": 2, "study.name": f"p-{contention}"})
        run = tuner("run", str(spec), "--storage", sqlite_url, "--no-confirm")
        assert run.returncode == 0, run.stderr[-2000:]
        timed = [t for t in trials(sqlite_url, f"p-{contention}") if A.TIMING in t.user_attrs]
        assert len(timed) == 2, [t.user_attrs for t in trials(sqlite_url, f"p-{contention}")]
        for t in timed:
            priority = t.user_attrs[A.TIMING]["priority"]
            assert priority["raised"] is raised_expected, priority
            if raised_expected:
                assert priority["nice"] == TIMING_NICE, priority
                assert priority["autogroup"] == (None if group is None else TIMING_NICE), priority
