"""bench/inductor_cpu.py: its study files are valid study files of today's code, and its ratios pair runs by round."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.inductor_cpu import ratios, study_file
from tuner.spec import load_spec


@pytest.mark.parametrize("scenario", ["mlp", "efficientnet"])
def test_each_scenario_writes_a_study_file_of_the_inductor_backend_on_the_cpu(tmp_path: Path, scenario: str) -> None:
    pytest.importorskip("onnx2torch", reason="onnx2torch (and the torchvision it imports) is not installed")
    spec = load_spec(study_file(scenario, tmp_path / scenario))
    assert spec.backend.name == "inductor" and spec.backend.options == {"device": "cpu"}
    assert spec.model.path.exists() and spec.run.budget == (4 if scenario == "mlp" else 2)


def test_ratios_are_today_over_then_within_each_round() -> None:
    runs = [
        {"round": 0, "label": "then", "wall_s": 20.0},
        {"round": 0, "label": "now", "wall_s": 10.0},
        {"round": 1, "label": "now", "wall_s": 15.0},
        {"round": 1, "label": "then", "wall_s": 20.0},
        {"round": 2, "label": "then", "wall_s": 40.0},  # its pair never ran: left out
    ]
    assert ratios(runs, "wall_s") == {"median": 0.625, "range": [0.5, 0.75]}
