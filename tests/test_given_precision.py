"""A model that is already quantized or already fp16 is recognised, and no precision variant is proposed for it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_study
from tests.helpers import trials
from tests.models import conv_model
from tests.test_tensorrt_mapping import TRT11
from tuner.backends.base import ModelInfo
from tuner.backends.onnxruntime.space import ort_space
from tuner.backends.tensorrt.gpt import EMPTY
from tuner.backends.tensorrt.space import trt_space
from tuner.precision import VariantOptions, make_variant
from tuner.precision.given import given_precision


def _dynamic_int8(tmp_path: Path) -> Path:
    """The test CNN quantized by ONNX Runtime's dynamic quantizer (ConvInteger, DynamicQuantizeLinear)."""
    from onnxruntime.quantization import quantize_dynamic

    out = tmp_path / "quantized.onnx"
    quantize_dynamic(str(conv_model(tmp_path / "fp32.onnx")), str(out))
    return out


def _static_qdq(tmp_path: Path) -> Path:
    """The test CNN quantized by ONNX Runtime's static quantizer (QuantizeLinear/DequantizeLinear pairs)."""
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Feeds(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.feeds = iter([{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    out = tmp_path / "qdq.onnx"
    quantize_static(str(conv_model(tmp_path / "fp32.onnx")), str(out), Feeds())
    return out


def test_the_precision_a_model_already_has_is_recognised(tmp_path: Path) -> None:
    assert given_precision(conv_model(tmp_path / "plain.onnx")).kind == "fp32"
    dynamic = given_precision(_dynamic_int8(tmp_path))
    assert dynamic.kind == "quantized" and "ConvInteger x2" in dynamic.evidence
    assert "DynamicQuantizeLinear" in dynamic.evidence
    qdq = given_precision(_static_qdq(tmp_path))
    assert qdq.kind == "quantized" and "DequantizeLinear" in qdq.evidence and "QuantizeLinear" in qdq.evidence
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((1, 3, 16, 16), dtype=np.float32)}]
    fp16 = make_variant(conv_model(tmp_path / "plain.onnx"), VariantOptions("fp16"), feeds, tmp_path / "variants")
    half = given_precision(fp16)
    assert half.kind == "fp16" and half.evidence.endswith("of its floating-point weights are fp16"), half


def test_no_variant_is_offered_for_an_already_quantized_model(tmp_path: Path) -> None:
    model = ModelInfo(_dynamic_int8(tmp_path), {"x": (1, 3, 16, 16)})
    for space in (ort_space(model), trt_space(TRT11, model, EMPTY, given_precision(model.path))):
        assert space.param("precision").choices == ("fp32",)
        assert "ConvInteger x2, MatMulInteger x1)" in space.param("precision").why
        assert all(r["precision"] == "fp32" for r in space.routes()[:50])
    refused = r"precision: \['int8_static'\] not among \['fp32'\]; the model is already quantized"
    with pytest.raises(ValueError, match=refused):
        ort_space(model).restrict({"precision": ["fp32", "int8_static"]})


def test_a_pre_quantized_model_gets_no_int8_or_fp16_proposals(cli, tmp_path: Path, write_spec, pg_url: str) -> None:
    """End to end: `tuner space` says what the model is, and a real study (real ONNX Runtime, a real worker) proposes
    only the graph as given, with no preparation for int8 variants."""
    spec = write_spec(
        **{"model.path": str(_dynamic_int8(tmp_path)), "run.budget": 3, "accuracy.tolerance": 0.05, "run.racing": False}
    )
    listed = cli("space", str(spec))
    assert listed.returncode == 0, listed.stderr
    assert "precision: the model is already quantized (DynamicQuantizeLinear x3, ConvInteger x2" in listed.stdout
    assert "model preparation before int8 variants" not in listed.stdout and "quant_types" not in listed.stdout
    run_study(spec, pg_url)
    ran = trials(pg_url, "tiny")
    assert len(ran) >= 3 and {t.params["precision"] for t in ran} == {"fp32"}
    assert not any(t.user_attrs.get("failure_class") in ("build-error", "known-failure") for t in ran)
    restricted = write_spec(
        "restricted.toml",
        **{"model.path": str(tmp_path / "quantized.onnx"), "backend.space": {"precision": ["fp32", "int8_dynamic"]}},
    )
    refused = cli("space", str(restricted))
    assert refused.returncode == 2 and "backend.space.precision" in refused.stderr
    assert "already quantized" in refused.stderr
