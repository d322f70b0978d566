"""What `tuner run` shows while it works: one line per finished trial, phase changes, confirmation rounds.

Without a terminal (a log file, `docker compose logs`) every event is one line on stderr as it
happens, plain text or, with `--log-format json`, one JSON object. On a terminal the same lines
scroll above a status line with the phase, the counts and an ETA from the budget and the median
trial time.
"""

from __future__ import annotations

import json
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from tuner.events import TRIALS, PhaseEvent, TrialEvent, event_json

TEXT, JSON = "text", "json"
LOG_FORMATS = (TEXT, JSON)


class Progress:
    """A `Study.run` callback printing to `console` (stderr); a context manager for the terminal's status line."""

    def __init__(self, console: Console, log_format: str = TEXT, quiet: bool = False, verbose: bool = False) -> None:
        self.console = console
        self.verbose = verbose
        self.json = log_format == JSON
        self.quiet = quiet
        self.phase = TRIALS
        self.last: TrialEvent | None = None
        self.last_at = time.monotonic()
        self.live: Live | None = None

    def __enter__(self) -> Progress:
        if self.console.is_terminal and not self.json and not self.quiet:
            self.live = Live(self._status(), console=self.console, refresh_per_second=2, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)
            self.live = None

    def __call__(self, event: Any) -> None:
        if isinstance(event, PhaseEvent):
            self.phase = event.phase
        if isinstance(event, TrialEvent):
            self.last, self.last_at = event, time.monotonic()
        if self.quiet:
            return
        if self.json:
            line = json.dumps(event_json(event))
        else:
            line = event.text(full_route=self.verbose) if isinstance(event, TrialEvent) else event.text()
        (self.live.console if self.live else self.console).print(line, markup=False, highlight=False, soft_wrap=True)
        if self.live is not None:
            self.live.update(self._status())

    def _status(self) -> Text:
        """The terminal's status line: phase, trials done of the budget, ETA."""
        if self.last is None:
            return Text(f"{self.phase} ...")
        e = self.last
        eta = "" if e.eta_s is None else f", ETA {max(0.0, e.eta_s - (time.monotonic() - self.last_at)):.0f} s"
        running = self.phase == TRIALS and e.done < e.budget
        return Text(f"{self.phase}: {e.done}/{e.budget} trials done{eta if running else ''}")
