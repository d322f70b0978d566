"""Writing files so that a reader sees the old content or the new, never half of either, even after a power loss."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A fresh temporary path beside `path` (same suffix) to write to; it replaces `path` when the block succeeds.

    Concurrent writers each get their own temporary name (the last one to finish wins); on an
    error the temporary file is removed and `path` is left as it was. The file is created by the
    writer, so it gets the usual permissions. Durable: the file's content reaches the disk before
    the rename (fsync), and the rename itself with the folder's fsync after it, so a crash of the
    machine leaves the old file or the whole new one, never an empty or partial file under `path`.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex[:12]}.tmp{path.suffix}")
    try:
        yield tmp
        fsync_path(tmp)
        tmp.replace(path)
        fsync_path(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def fsync_path(path: Path) -> None:
    """Flush a file's or a folder's content and metadata to the disk."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes | str) -> None:
    """Replace `path` with `data` atomically (text is written as UTF-8)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
