"""`atomic_write`: a reader sees the old file or the new one, and the new one is on the disk before it is named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tuner.files import atomic_path, atomic_write


def test_atomic_write_fsyncs_the_file_before_the_rename_and_its_folder_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "result.json"
    target.write_text("old")
    synced: list[tuple[str, str]] = []  # (what the descriptor is, what `target` held at that moment)
    real_fsync = os.fsync

    def observed_fsync(fd: int) -> None:  # the real fsync, observed: which file it flushed, and when
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), target.read_text()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", observed_fsync)
    atomic_write(target, '{"status": "ok"}')
    assert target.read_text() == '{"status": "ok"}'
    (file_path, before_rename), (dir_path, after_rename) = synced
    assert Path(file_path).parent == tmp_path and Path(file_path).name.startswith(".result.") and before_rename == "old"
    assert Path(dir_path) == tmp_path and after_rename == '{"status": "ok"}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    target = tmp_path / "engine.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("the writer failed")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["engine.bin"]
