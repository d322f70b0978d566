"""An ONNX Runtime int8 recipe, read from a route: what `quantize` makes and what a variant key hashes."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.space import Route


@dataclass(frozen=True)
class QuantOptions:
    """One int8 recipe; fields that do not apply to `mode` are normalised away by `from_route`."""

    mode: str  # "static" | "dynamic"
    activation: str = "U8"  # static only
    weight: str = "S8"
    quant_format: str = "qdq"  # static only; dynamic is always ORT's integer operators
    activation_symmetric: bool = False
    weight_symmetric: bool = True
    reduce_range: bool = False
    per_channel: bool = True
    calibration: str = "minmax"
    percentile: float = 99.999
    quant_ops: str = "all"
    fp32_nodes: int = 0

    @classmethod
    def from_route(cls, route: Route) -> QuantOptions | None:
        """The recipe a route asks for, or None when its precision is not an ONNX Runtime int8 one."""
        precision = route.get("precision")
        common = {
            "reduce_range": bool(route.get("reduce_range", False)),
            "per_channel": bool(route.get("per_channel", True)),
            "quant_ops": str(route.get("quant_ops", "all")),
        }
        if precision == "int8_dynamic":
            return cls(
                "dynamic", activation="U8", weight=str(route.get("weight_type", "S8")), quant_format="integer", **common
            )
        if precision != "int8_static":
            return None
        types = str(route.get("quant_types", "U8S8"))
        calibration = str(route.get("calibration", "minmax"))
        return cls(
            "static",
            activation=types[:2],
            weight=types[2:],
            quant_format=str(route.get("quant_format", "qdq")),
            activation_symmetric=bool(route.get("activation_symmetric", False)),
            weight_symmetric=bool(route.get("weight_symmetric", True)),
            calibration=calibration,
            percentile=float(route.get("percentile", 99.999)) if calibration == "percentile" else 99.999,
            fp32_nodes=int(route.get("fp32_nodes", 0)),
            **common,
        )

    def op_types(self) -> list[str] | None:
        """The op types to quantize (None: every type ORT can quantize)."""
        return None if self.quant_ops == "all" else [self.quant_ops]
