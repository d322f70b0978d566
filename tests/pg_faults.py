"""Faults at exact points of the PostgreSQL conversation, for `tests.proxy.TcpProxy(watch=...)`.

A `Watch` reads what clients send (the frontend protocol: start-up, then typed messages; libpq's
simple `Q` queries carry the SQL with its parameters, which is how psycopg2 talks), collects each
transaction's statements and, at its COMMIT, names the step of the trial lifecycle it belongs to
(`STEPS`). For each step armed with `drop_after_commit`, the first COMMIT of that step is forwarded
and its reply swallowed: the server committed, the client sees its connection break and must not
do the work twice. `on_statement` calls back when a statement of a step passes (a partition in the
middle of a tell).
"""

from __future__ import annotations

import re
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# A transaction's step, by what it writes (first match wins; one transaction may hold several).
STEPS = {
    "reap": re.compile(r"UPDATE tuner_leases SET .*'reaped'", re.IGNORECASE | re.DOTALL),
    "requeue": re.compile(r"INSERT INTO trials .*'WAITING'", re.IGNORECASE | re.DOTALL),
    "record": re.compile(r"INSERT INTO tuner_(measurements|results)\b", re.IGNORECASE),
    "tell": re.compile(r"UPDATE trials SET .*state=.(COMPLETE|PRUNED|FAIL)", re.IGNORECASE | re.DOTALL),
}
_STARTUP_CODES = {80877103, 80877104}  # SSLRequest, GSSENCRequest: answered with one byte, then the real start-up


@dataclass
class Connection:
    """One client connection as the watch sees it."""

    watch: Watch
    buffer: bytes = b""
    started: bool = False
    statements: list[str] = field(default_factory=list)
    doomed: bool = False

    def sent(self, data: bytes) -> None:
        """Bytes the client sent (before they are forwarded)."""
        self.buffer += data
        while True:
            if not self.started:
                if len(self.buffer) < 8:
                    return
                length, code = struct.unpack("!II", self.buffer[:8])
                if len(self.buffer) < length:
                    return
                self.buffer = self.buffer[length:]
                self.started = code not in _STARTUP_CODES
                continue
            if len(self.buffer) < 5:
                return
            kind, length = self.buffer[:1], struct.unpack("!I", self.buffer[1:5])[0]
            if len(self.buffer) < 1 + length:
                return
            body, self.buffer = self.buffer[5 : 1 + length], self.buffer[1 + length :]
            if kind in (b"Q", b"P"):
                sql = body.split(b"\0")[1 if kind == b"P" else 0].decode(errors="replace")
                self._statement(sql)

    def _statement(self, sql: str) -> None:
        word = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        if word in ("BEGIN", "ROLLBACK"):
            self.statements = []
        elif word in ("COMMIT", "END"):
            self.doomed = self.watch.committing(self.statements)
            self.statements = []
        else:
            self.statements.append(sql)
            self.watch.statement(sql)


class Watch:
    """Which steps to break after their COMMIT, and what was broken when."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.armed: set[str] = set()
        self.dropped: dict[str, float] = {}  # step -> when its COMMIT's reply was swallowed (time.monotonic)
        self.listeners: list[tuple[str, Callable[[], None]]] = []

    def connection(self) -> Connection:
        """The watch of one new client connection."""
        return Connection(self)

    def drop_after_commit(self, *steps: str) -> None:
        """Break the connection after the next COMMIT of each of `steps`, once each."""
        with self._lock:
            self.armed |= set(steps) - set(self.dropped)

    def on_statement(self, step: str, callback: Callable[[], None]) -> None:
        """Call `callback` once, in a thread of its own, when a statement of `step` next passes."""
        with self._lock:
            self.listeners.append((step, callback))

    def committing(self, statements: list[str]) -> bool:
        """Whether this COMMIT's reply is to be swallowed (its transaction is of an armed step)."""
        text = "\n".join(statements)
        with self._lock:
            for step in list(self.armed):
                if STEPS[step].search(text):
                    self.armed.discard(step)
                    self.dropped[step] = time.monotonic()
                    return True
        return False

    def statement(self, sql: str) -> None:
        with self._lock:
            due = [(s, cb) for s, cb in self.listeners if STEPS[s].search(sql)]
            self.listeners = [x for x in self.listeners if x not in due]
        for _, callback in due:
            threading.Thread(target=callback, daemon=True).start()
