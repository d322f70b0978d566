"""A WSGI middleware that answers only requests addressed to this server by an expected name.

A page on another site can make a browser on this machine send requests to 127.0.0.1 under its own
name (DNS rebinding: `attacker.example` resolves to the attacker, then to 127.0.0.1); the request
then carries `Host: attacker.example`. optuna-dashboard has no authentication, so every request
whose Host header names anything but loopback or a name the user allowed is refused (403).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def host_name(header: str) -> str:
    """The name in a Host header, without its port and IPv6 brackets, lower case."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def allowed_names(bind_host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """Loopback names, the address served on (unless it is a wildcard) and the names given."""
    names = set(LOOPBACK_NAMES) | {host_name(n) for n in extra}
    if bind_host not in ("0.0.0.0", "::", ""):
        names.add(host_name(bind_host if ":" not in bind_host else f"[{bind_host}]"))
    return frozenset(names)


class HostCheck:
    """Wrap `app`: a request whose Host header is not one of `allowed` gets 403 and never reaches it."""

    def __init__(self, app: WSGIApp, allowed: frozenset[str]) -> None:
        self.app, self.allowed = app, allowed

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if host_name(environ.get("HTTP_HOST", "")) in self.allowed:
            return self.app(environ, start_response)
        body = (
            b"Forbidden: unexpected Host header (start `tuner dashboard` with --allow-host NAME to serve under "
            b"that name)\n"
        )
        start_response("403 Forbidden", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]
