"""Backend-neutral measurement: validation inputs, reference outputs, accuracy metrics, latency."""
