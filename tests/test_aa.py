"""The A/A benchmark's pieces (bench/aa.py): an identical-routes landscape, one replayed study, the results merge."""

from __future__ import annotations

import json
from pathlib import Path

from bench import aa
from bench.landscape.truth import Truth
from tuner.backends.replay.landscape import load_landscape

LANDSCAPE = aa.LANDSCAPES[0]


def test_every_route_of_the_aa_landscape_is_the_default_engine() -> None:
    source = load_landscape(aa.REPO / LANDSCAPE)
    truth = Truth(source, tolerance=float(source.meta["accuracy"]["tolerance"]))
    landscape, about = aa.identical_landscape(LANDSCAPE, source, truth)
    default = landscape.point(truth.space.default_route())
    assert default is not None and about["pool_rounds"] == len(default.rounds) > 3
    valid = [p for p in landscape.points if not p.invalid]
    assert len(valid) > 100 and all(p.rounds == default.rounds and p.outputs == default.outputs for p in valid)
    row = aa.replay_study(Truth(landscape, tolerance=truth.tolerance), seed=1, trials=6)
    assert row["verdict"] in (aa.SPEEDUP, "default") and row["trials"] >= 6 and row["study_speedup"] is not None


def test_results_are_merged_under_their_own_key(tmp_path: Path) -> None:
    path = tmp_path / "measurement.json"
    path.write_text(json.dumps({"cpu_1_worker": {"agreement": 1.02}, "aa": {"cpu": {"studies": 5}}}))
    aa.write_part("replay", {"studies": 400}, path)
    doc = json.loads(path.read_text())
    assert doc["cpu_1_worker"] == {"agreement": 1.02}  # another helper's key is kept
    assert doc["aa"]["cpu"] == {"studies": 5} and doc["aa"]["replay"] == {"studies": 400} and "note" in doc["aa"]
