"""Storage credentials: masked everywhere a URL could be printed, logged or stored, and kept from processes that need
none.

A URL carries secrets in two places: the password of its userinfo (`scheme://user:PASSWORD@host`)
and password-like query keys (`?password=`, `sslpassword`, `passwd`, `pwd`, `secret`, `token`,
`api_key`, ...: any key whose name contains one of `SECRET_KEY`'s words). Both are shown as `***`.
Processes that never talk to the database (a trial's child, the reference run) get an environment
without the storage URL and without libpq's variables (`env_without_credentials`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import unquote_plus

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

STORAGE_ENV = "TUNER_STORAGE"  # the storage URL when no --storage is given
LIBPQ_ENV_PREFIX = "PG"  # libpq's variables: PGPASSWORD, PGPASSFILE, PGSSLKEY, PGHOST, PGUSER, ...
MASK = "***"
SECRET_KEY = re.compile(r"pass|pwd|secret|token|api[_-]?key|credential", re.IGNORECASE)
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>`]*")
_USERINFO = re.compile(r"^([^:]*://[^:/@]*:)[^@]*@")  # scheme://user:  password  @
_QUERY_ITEM = re.compile(r"([?&;])([^=&;#]*)=([^&;#]*)")


def is_secret_key(name: str) -> bool:
    """Whether a URL query key names a secret (`password`, `sslpassword`, `token`, ...)."""
    return bool(SECRET_KEY.search(name))


def _mask_one(url: str) -> str:
    masked = _USERINFO.sub(rf"\g<1>{MASK}@", url, count=1)
    return _QUERY_ITEM.sub(lambda m: f"{m[1]}{m[2]}={MASK}" if is_secret_key(unquote_plus(m[2])) else m[0], masked)


def mask_url(url: str) -> str:
    """The URL with its password and the values of password-like query keys replaced by ***."""
    return _mask_one(url)


def secrets_of(url: str) -> list[str]:
    """The URL's secrets as written and as decoded: its password and the values of its password-like query keys."""
    found: list[str] = []
    m = _USERINFO.match(url)
    if m:
        found.append(url[m.end(1) : m.end() - 1])
    found += [q[3] for q in _QUERY_ITEM.finditer(url) if q[3] and is_secret_key(unquote_plus(q[2]))]
    try:
        parsed = make_url(url)
        found += [str(parsed.password)] if parsed.password else []
        for key, value in parsed.query.items():
            if is_secret_key(key):
                found += [value] if isinstance(value, str) else list(value)
    except (ArgumentError, ValueError):
        pass
    return sorted({s for s in found + [unquote_plus(s) for s in found] if s and s != MASK}, key=len, reverse=True)


def password_of(url: str) -> str | None:
    """The URL's userinfo password, if any."""
    try:
        password = make_url(url).password
        return str(password) if password else None
    except (ArgumentError, ValueError):
        m = _USERINFO.match(url)
        return url[m.end(1) : m.end() - 1] if m else None


def scrub(text: str, url: str) -> str:
    """`text` with the raw URL shown masked and every secret of the URL replaced by ***."""
    out = text.replace(url, mask_url(url))
    for secret in secrets_of(url):
        out = out.replace(secret, MASK)
    return out


def mask_credentials(text: str, url: str | None = None) -> str:
    """`text` with every URL in it masked (`mask_url`), and every secret of `url` too."""
    masked = _URL.sub(lambda m: _mask_one(m[0]), text)
    return scrub(masked, url) if url else masked


def has_secret(url: str) -> bool:
    """Whether the URL carries a password or a password-like query value."""
    return mask_url(url) != url


def env_without_credentials(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without the storage URL and without any of libpq's `PG*` variables (a password, key or pgpass file)."""
    return {k: v for k, v in env.items() if k != STORAGE_ENV and not k.startswith(LIBPQ_ENV_PREFIX)}


def normalize_url(url: str) -> str:
    """Pin PostgreSQL URLs without a driver to psycopg2 (SQLAlchemy 2.1 would pick psycopg 3)."""
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+psycopg2://" + url[len(plain) :]
    return url
