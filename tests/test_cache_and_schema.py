"""Content-addressed build cache, our schema beside Optuna's, and migrations."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine, inspect, text

from tests.conftest import run_study, tuner
from tests.helpers import trials
from tests.models import conv_model
from tuner.store.db import head_revision
from tuner.store.urls import normalize_url

FAULT = "tests.backends:FaultBackend"


def _builds(markers: Path) -> int:
    return len(list(markers.glob("build-*")))


def test_repeated_route_is_served_from_the_cache_and_a_changed_model_is_not(write_spec, pg_url, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    options = {"marker_dir": str(markers)}
    first = write_spec(
        "a.toml", **{"study.name": "first", "backend.name": FAULT, "backend.options": options, "run.budget": 1}
    )
    run_study(first, pg_url)
    assert _builds(markers) == 1
    # Another study with the same model, data and route: the baseline result is reused, nothing is built.
    second = write_spec(
        "b.toml", **{"study.name": "second", "backend.name": FAULT, "backend.options": options, "run.budget": 1}
    )
    run_study(second, pg_url)
    assert _builds(markers) == 1
    reused = trials(pg_url, "second")[0]
    assert reused.user_attrs["cache_hit"] is True and reused.user_attrs["cached_from"] == "first#0"
    assert reused.value == trials(pg_url, "first")[0].value
    # nothing ran in a child: all of the cached trial's time is the tuner's own
    assert reused.user_attrs["overhead_s"] == reused.user_attrs["trial_wall_s"] > 0
    # Same shapes, different weights: a new key, so a real build.
    conv_model(tmp_path / "tiny.onnx", seed=1)
    third = write_spec(
        "c.toml", **{"study.name": "third", "backend.name": FAULT, "backend.options": options, "run.budget": 1}
    )
    run_study(third, pg_url)
    assert _builds(markers) == 2
    assert trials(pg_url, "third")[0].user_attrs["cache_hit"] is False


def test_first_run_sets_up_both_schemas_apart(write_spec, pg_url) -> None:
    spec = write_spec(**{"run.budget": 1})
    run_study(spec, pg_url)
    engine = create_engine(normalize_url(pg_url))
    tables = set(inspect(engine).get_table_names())
    assert {"trials", "studies", "alembic_version"} <= tables  # Optuna's
    assert {
        "tuner_results",
        "tuner_measurements",
        "tuner_environments",
        "tuner_artifacts",
        "tuner_leases",
        "tuner_studies",
        "tuner_alembic_version",
    } <= tables  # ours, with their own version table
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM tuner_alembic_version")).scalar() == head_revision()
        assert conn.execute(text("SELECT count(*) FROM tuner_measurements")).scalar() == 1
        samples = conn.execute(text("SELECT samples_ms FROM tuner_measurements")).scalar()
    assert len(samples) >= 5
    assert all(s == round(s, 6) for s in samples)  # kept at 1 ns, the host clock's resolution
    engine.dispose()


def test_db_upgrade_on_an_empty_database_and_refusal_of_a_newer_schema(write_spec, pg_url) -> None:
    up = tuner("db", "upgrade", "--storage", pg_url)
    assert up.returncode == 0, up.stderr
    head = head_revision()
    assert f"none -> {head}" in up.stdout
    assert f"{head} -> {head}" in tuner("db", "upgrade", "--storage", pg_url).stdout
    engine = create_engine(normalize_url(pg_url))
    with engine.begin() as conn:
        conn.execute(text("UPDATE tuner_alembic_version SET version_num = '9999'"))
    engine.dispose()
    result = tuner("run", str(write_spec()), "--storage", pg_url)
    assert result.returncode == 2
    assert "newer than this route-tuner knows" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_output_without_a_terminal_is_not_wrapped(tmp_path: Path) -> None:
    """A log line keeps a long storage URL whole (without a terminal rich would wrap at 80 columns)."""
    folder = tmp_path / ("a-folder-name-long-enough-that-the-url-passes-eighty-columns-" * 2)
    folder.mkdir()
    url = f"sqlite:///{folder / 'study.db'}"
    up = tuner("db", "upgrade", "--storage", url, env={"COLUMNS": ""})
    assert up.returncode == 0, up.stderr
    assert len(url) > 120 and up.stdout.splitlines()[0].startswith(f"{url}: optuna schema "), up.stdout
