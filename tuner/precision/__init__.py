"""Backend-neutral precision variants of an ONNX model, each a content-addressed file made once.

TensorRT 11 is strongly typed: precision comes from the graph (Cast nodes, Q/DQ nodes), not from
builder flags. The same variants serve ONNX Runtime. A variant is identified by its options; its
file name is the hash of (source model bytes, options, calibration data), so it is produced once per
study and shared by every worker.
"""

from tuner.precision.variants import BLOCK_LISTS, PRECISIONS, VariantOptions, make_variant

__all__ = ["BLOCK_LISTS", "PRECISIONS", "VariantOptions", "make_variant"]
