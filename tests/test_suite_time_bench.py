"""bench/suite_time.py's bookkeeping: a new side-by-side pair never loses the one it replaces; an old suite runs as
its own Makefile ran it."""

from __future__ import annotations

from pathlib import Path

from bench.suite_time import keep_earlier, own_workers


def test_a_new_whole_suite_pair_keeps_the_one_it_replaces_under_its_own_name() -> None:
    first = {"then_commit": "db1136d", "now_commit": "1ce71f7", "runs": [{"wall_s": 488.4}]}
    pairs = {"db1136d": first}
    keep_earlier(pairs, "db1136d")
    assert pairs["db1136d-against-1ce71f7"] is first
    pairs["db1136d"] = {"then_commit": "db1136d", "now_commit": "fcc22b4", "runs": []}
    keep_earlier(pairs, "db1136d")
    assert pairs["db1136d-against-1ce71f7"] is first and pairs["db1136d-against-fcc22b4"]["now_commit"] == "fcc22b4"
    keep_earlier(pairs, "4de0a1e")  # nothing there yet: nothing to keep
    assert set(pairs) == {"db1136d", "db1136d-against-1ce71f7", "db1136d-against-fcc22b4"}


def test_then_runs_with_the_worker_count_its_own_makefile_used(tmp_path: Path) -> None:
    (tmp_path / "Makefile").write_text("test: $(TESTDEPS)\n\t$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup\n")
    assert own_workers(tmp_path, 3) == 3
    (tmp_path / "Makefile").write_text("test: .venv\n\t$(PY) -m pytest -q\n")  # one process, as it was early on
    assert own_workers(tmp_path, 3) == 0
