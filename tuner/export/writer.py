"""Write an export directory all at once, following no symbolic link.

Every file is first written into a fresh staging directory beside the target (created by `mkdtemp`,
each file opened with `O_CREAT | O_EXCL | O_NOFOLLOW`), so a failure part-way leaves the target as it
was. `publish` then renames the staging directory into place when the target does not exist (one
atomic rename), or moves each staged file over its namesake in an existing target directory (each
an atomic rename, which replaces a name and never writes through it). A target that is a symbolic
link, or that holds a symbolic link or a directory where an exported file goes, is refused before
anything is moved; files of the target the export does not write are left alone.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from types import TracebackType

from tuner.errors import TunerError
from tuner.measure.inputs import file_hash

CHUNK = 1 << 20


class ExportWriter:
    """Stage files for `out`, then `publish` them; used as a context manager, the staging goes on any error."""

    def __init__(self, out: Path) -> None:
        self.out = out
        if out.is_symlink():
            raise TunerError(f"{out}: is a symbolic link; not exporting through it (name a real directory)")
        if out.exists() and not out.is_dir():
            raise TunerError(f"{out}: exists and is not a directory")
        out.parent.mkdir(parents=True, exist_ok=True)
        self.stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
        self.names: list[str] = []

    def __enter__(self) -> ExportWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        shutil.rmtree(self.stage, ignore_errors=True)

    def _open(self, name: str, mode: int) -> int:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"export file name {name!r}")
        self.names.append(name)
        return os.open(self.stage / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)

    def write(self, name: str, data: str | bytes, executable: bool = False) -> None:
        """Stage `name` with `data` (text as UTF-8)."""
        with os.fdopen(self._open(name, 0o755 if executable else 0o644), "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)

    def copy(self, name: str, source: Path, sha256: str | None = None) -> None:
        """Stage a copy of `source` as `name`; with `sha256`, refuse a copy whose bytes do not hash to it."""
        with open(source, "rb") as src, os.fdopen(self._open(name, 0o644), "wb") as dst:
            shutil.copyfileobj(src, dst, CHUNK)
        if sha256 is not None:
            found = file_hash(
                self.stage / name
            )  # the copy is what is checked: nothing can change between check and copy
            if found != sha256:
                raise TunerError(
                    f"{source}: has changed since it was recorded (sha256 {found[:12]}, expected {sha256[:12]}); "
                    "not exported, rebuild it with `tuner build`"
                )

    def publish(self) -> None:
        """Move every staged file into `out` (see the module's docstring)."""
        if not self.out.exists() and not self.out.is_symlink():
            self.stage.chmod(0o755)
            os.rename(self.stage, self.out)
            return
        try:  # the directory itself, never a link to one: every check and rename below is relative to it
            target = os.open(self.out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            raise TunerError(f"{self.out}: not a directory of its own ({exc.strerror}); nothing was moved") from exc
        try:
            blocked = [n for n in self.names if _is_link_or_dir(n, target)]
            if blocked:
                raise TunerError(
                    f"{self.out}: {', '.join(blocked)} is a symbolic link or a directory; not replacing it "
                    "(nothing was moved)"
                )
            staged = os.open(self.stage, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                for name in self.names:
                    os.replace(name, name, src_dir_fd=staged, dst_dir_fd=target)
            finally:
                os.close(staged)
        finally:
            os.close(target)


def _is_link_or_dir(name: str, directory: int) -> bool:
    try:
        mode = os.lstat(name, dir_fd=directory).st_mode
    except FileNotFoundError:
        return False
    return stat.S_ISLNK(mode) or stat.S_ISDIR(mode)
