"""Storage URLs: masking passwords everywhere they could be printed, logged or stored."""

from __future__ import annotations

import re

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError


def mask_url(url: str) -> str:
    """The URL with its password replaced by ***."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def password_of(url: str) -> str | None:
    """The URL's password, if any (used to scrub it from error messages)."""
    try:
        return make_url(url).password
    except (ArgumentError, ValueError):
        m = re.search(r"://[^:/@]*:([^@]*)@", url)
        return m.group(1) if m else None


def scrub(text: str, url: str) -> str:
    """`text` with the URL's password and the raw URL removed."""
    secret = password_of(url)
    out = text.replace(url, mask_url(url))
    if secret:
        out = out.replace(str(secret), "***")
    return out


_CREDENTIAL = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@\"']*:)[^\s@\"']*@")


def mask_credentials(text: str, url: str | None = None) -> str:
    """`text` with the password of every `scheme://user:password@` URL in it, and of `url`, replaced by ***."""
    masked = _CREDENTIAL.sub(r"\1***@", text)
    return scrub(masked, url) if url else masked


def normalize_url(url: str) -> str:
    """Pin PostgreSQL URLs without a driver to psycopg2 (SQLAlchemy 2.1 would pick psycopg 3)."""
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+psycopg2://" + url[len(plain):]
    return url
