"""Writing files so that a reader sees the old content or the new, never half of either."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A fresh temporary path beside `path` (same suffix) to write to; it replaces `path` when the block succeeds.

    Concurrent writers each get their own temporary name (the last one to finish wins); on an
    error the temporary file is removed and `path` is left as it was. The file is created by the
    writer, so it gets the usual permissions.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex[:12]}.tmp{path.suffix}")
    try:
        yield tmp
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: Path, data: bytes | str) -> None:
    """Replace `path` with `data` atomically (text is written as UTF-8)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
