"""Route Tuner: find the fastest compiled engine for an ONNX model within an accuracy tolerance."""

__version__ = "0.1.0"
