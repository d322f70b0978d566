"""Keep a trial's artifact: move the file its child built into the content-addressed store and record where.

The store is `work_dir/artifacts/<sha256><suffix>`, one `tuner_artifacts` row per file. The child's
report is not trusted: the path must lie inside the trial's out dir, and the hash and size kept are
the ones computed here. Keeping decides nothing about the trial: what a refused path or a failing
disk means for its outcome is the evaluation's to say (`tuner.worker.evaluate`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.measure.inputs import file_hash
from tuner.store.cache import ResultStore


class Outside(ValueError):
    """The child reported an artifact outside its out dir; it is left where it is."""


@dataclass(frozen=True)
class Kept:
    """A kept artifact: where it is now, its sha256 and its size in bytes."""

    path: Path
    sha256: str
    size: int


@dataclass
class Artifacts:
    """The artifact store of one study's work dir."""

    root: Path  # work_dir/artifacts
    results: ResultStore
    backend: str  # recorded with each file
    db: Callable[[Callable[[], Any]], Any]  # runs a database write, retried while the database is away

    def keep(self, reported: Path, out_dir: Path) -> Kept | None:
        """Move the artifact a child reported at `reported` into the store and record it; None if no such file.

        Raises `Outside` for a path outside `out_dir`, and the `OSError` of a disk that fails meanwhile.
        """
        if not reported.resolve().is_relative_to(out_dir.resolve()):
            raise Outside(f"the build reported an artifact outside its out dir ({reported}); not kept")
        if not reported.is_file():
            return None
        sha256, size = file_hash(reported), reported.stat().st_size
        dest = self.root / f"{sha256}{reported.suffix}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            shutil.move(str(reported), dest)
        self.db(lambda: self.results.add_artifact(sha256, str(dest), size, self.backend))
        return Kept(dest, sha256, size)
