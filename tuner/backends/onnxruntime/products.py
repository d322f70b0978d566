"""The intermediate files a route needs, named by content keys, and the failures learned about them.

A route's build makes, in order: the transformer-fused model (when fusions are on), the prepared
model (int8 only), the precision variant, then the ORT session. Each intermediate product's key is
computed from the keys of what it is made of (source model bytes, the knobs that shape it, the
calibration feeds), never from the route's session knobs, so the worker computes them without
building anything. A product that fails to build is recorded under its key the first time
(`FailureBook`); every later route that needs it is known to fail at once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tuner.backends.onnxruntime.recipe import QuantOptions
from tuner.files import atomic_write
from tuner.space import Route

FUSIONS = {
    "fuse_attention": "enable_attention",
    "fuse_skip_layer_norm": "enable_skip_layer_norm",
    "fuse_embed_layer_norm": "enable_embed_layer_norm",
    "fuse_gelu": "enable_gelu",
    "fuse_bias_gelu": "enable_bias_gelu",
    "fuse_layer_norm": "enable_layer_norm",
}
PREPARATION = "prep-v1"  # bump when prepare.py changes what it writes
SENSITIVITY = "sens-v1"


def _key(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Product:
    """One intermediate file of a build: what it is and its content key."""

    kind: str  # "fused" | "prepared" | "variant"
    key: str


def fusion_switches(route: Route) -> dict[str, bool]:
    """The transformer-optimizer switches of a route (FusionOptions attribute -> on)."""
    return {attr: bool(route.get(name, True)) for name, attr in FUSIONS.items()}


def products(route: Route, model_sha: str, options: Mapping[str, Any], data_sha: str) -> list[Product]:
    """The products `route` needs, in build order."""
    out: list[Product] = []
    source = model_sha
    if route.get("transformer_fusion"):
        source = _key({"m": model_sha, "s": fusion_switches(route), "o": dict(options)})
        out.append(Product("fused", source))
    recipe = QuantOptions.from_route(route)
    if recipe is not None:
        prepared = _key({"source": source, "prep": PREPARATION})
        out.append(Product("prepared", prepared))
        out.append(
            Product(
                "variant",
                _key(
                    {
                        "prepared": prepared,
                        "recipe": asdict(recipe),
                        "feeds": data_sha if recipe.mode == "static" else "",
                    }
                ),
            )
        )
    elif route.get("precision", "fp32") != "fp32":
        out.append(
            Product(
                "variant",
                _key({"source": source, "precision": route["precision"], "keep_fp32": route.get("keep_fp32", "none")}),
            )
        )
    return out


def sensitivity_key(prepared: Product, data_sha: str, reduce_range: bool) -> str:
    """The key of a prepared model's per-node sensitivity pass."""
    return _key({"prepared": prepared.key, "feeds": data_sha, "reduce_range": reduce_range, "v": SENSITIVITY})


class FailureBook:
    """Failed products of one study's work dir: `<work_dir>/variants/failed/<key>.json`."""

    def __init__(self, work_dir: Path) -> None:
        self.dir = work_dir / "variants" / "failed"

    def record(self, product: Product, message: str) -> None:
        """Remember that `product` cannot be made (first writer wins; later ones are identical)."""
        atomic_write(
            self.dir / f"{product.key}.json",
            json.dumps({"kind": product.kind, "key": product.key, "message": message[:2000]}),
        )

    def lookup(self, needed: list[Product]) -> tuple[Product, str] | None:
        """The first needed product already known to fail, with its recorded message."""
        for product in needed:
            path = self.dir / f"{product.key}.json"
            if path.exists():
                return product, str(json.loads(path.read_text())["message"])
        return None
