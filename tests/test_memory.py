"""Peak memory while an engine loads and runs (`tuner.measure.memory`): the process's own RSS growth, read for real."""

from __future__ import annotations

from tuner.measure.memory import DEVICE, HOST, MemoryProbe


def test_the_probe_reports_what_was_allocated_after_it_started_even_once_freed() -> None:
    kept = bytearray(96 << 20)  # resident before the probe started: not counted
    probe = MemoryProbe.start()
    block = bytearray(64 << 20)  # 64 MiB, written (zero-filled), so resident
    del block
    peak, kind = probe.peak(gpu=False)
    assert kind == HOST and peak is not None and 60 <= peak < 96, peak
    assert len(kept) == 96 << 20


def test_without_a_cuda_context_device_memory_is_unknown_not_zero() -> None:
    assert MemoryProbe.start().peak(gpu=True) == (None, DEVICE)
