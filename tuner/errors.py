"""Errors the user can act on (one line naming what is wrong and what is expected), and the failures trials record."""

from __future__ import annotations

import importlib.util
from typing import ClassVar

from tuner import job as J


class TunerError(Exception):
    """A problem with the user's input or environment; printed as one line, exit status `exit_code`."""

    exit_code: ClassVar[int] = 2  # bad input: the study file, the model, the data, an option


class MissingLibrary(TunerError):
    """An optional library the study needs is not installed; the message says what to install (exit status 3)."""

    exit_code: ClassVar[int] = 3  # the environment, not the input


class Unavailable(TunerError):
    """The environment failed the study: the database is unreachable, the workers died (exit status 3)."""

    exit_code: ClassVar[int] = 3


class Interrupted(TunerError):
    """The run was stopped (Ctrl-C, SIGTERM); what is done is kept and the next run resumes (exit status 130)."""

    exit_code: ClassVar[int] = 130


def require(module: str, needed_by: str, install: str) -> None:
    """Raise MissingLibrary unless the top-level `module` is importable: "`needed_by` needs `module` ...: `install`"."""
    if importlib.util.find_spec(module) is None:
        raise MissingLibrary(f"{needed_by} needs {module}, which is not installed: {install}")


class SpecError(TunerError):
    """A study file is invalid: the message names the file, the field and what is expected."""

    def __init__(self, path: object, field: str, expected: str) -> None:
        self.path = str(path)
        self.field = field
        self.expected = expected
        super().__init__(f"{self.path}: {field}: {expected}")


class ResumeError(TunerError):
    """An existing study was created from an incompatible study file."""


class TrialFailure(Exception):
    """A route failed in a way its trial records: the message goes with the trial, the type names the class.

    Every subclass sets `failure_class` to an outcome declared in `tuner.job` (the one list of
    outcomes; a test checks that every subclass in `tuner` names a declared one).
    """

    failure_class: ClassVar[str] = J.BUILD_ERROR


class EnvironmentFailure(TrialFailure):
    """The machine, not the route, failed (disk full, out of memory, device busy): never cached, run again."""

    failure_class: ClassVar[str] = J.ENVIRONMENT_ERROR


def first_line(exc: BaseException | str, default: str = "") -> str:
    """The first non-blank line of an exception's message (or of a text); `default` when there is none."""
    for line in str(exc).strip().splitlines():
        if line.strip():
            return line.strip()
    return default
