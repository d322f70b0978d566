"""Model preparation leaves nothing behind in the directory it was started from."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.models import unknown_op_model
from tuner.backends.onnxruntime.prepare import _describe, _pre_process


def test_incomplete_symbolic_shape_inference_leaves_no_file_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ONNX Runtime's symbolic shape inference saves a partial model as sym_shape_infer_temp.onnx in the
    # current directory when it cannot infer every shape (here: an op of an unknown domain).
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    src = unknown_op_model(tmp_path / "model.onnx")
    out = tmp_path / "prepared" / "model.onnx"
    out.parent.mkdir()
    step = _pre_process(src, out)
    assert "Incomplete symbolic shape inference" in step["detail"]  # the case that writes the file
    assert out.exists()
    assert list(cwd.iterdir()) == []
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.onnx"]


def test_a_failure_without_a_message_says_where_it_was_raised() -> None:
    try:
        raise AssertionError()  # what a bare `assert` in ONNX Runtime's shape inference raises
    except AssertionError as exc:
        described = _describe(exc)
    assert described.startswith("AssertionError: raised at test_preparation_scratch.py:")
    assert _describe(ValueError("a  multi-line\n message")) == "ValueError: a multi-line message"
