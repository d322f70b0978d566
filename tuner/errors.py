"""Errors the user can act on. Each carries one line that names what is wrong and what is expected."""


class TunerError(Exception):
    """A problem with the user's input or environment; printed as one line, exit status 2."""


class SpecError(TunerError):
    """A study file is invalid: the message names the file, the field and what is expected."""

    def __init__(self, path: object, field: str, expected: str) -> None:
        self.path = str(path)
        self.field = field
        self.expected = expected
        super().__init__(f"{self.path}: {field}: {expected}")


class ResumeError(TunerError):
    """An existing study was created from an incompatible study file."""
