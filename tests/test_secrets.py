"""Credentials: a storage URL's password, in its userinfo or its query, is never printed or stored.

Real PostgreSQL (trust authentication, so a password in the URL is carried but not checked), the
real CLI in subprocesses, and a dump of every row of every table afterwards.
"""

from __future__ import annotations

import pytest

from tests.conftest import tuner
from tests.helpers import all_rows_text
from tuner.store.urls import env_without_credentials, has_secret, mask_credentials, mask_url, scrub

WIDE = {"COLUMNS": "1000"}  # one line per message: a secret split by wrapping would pass unseen
SECRET_KEYS = ("password", "passwd", "pwd", "sslpassword", "secret", "token", "access_token", "api_key", "PassWord")


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_password_like_query_keys_are_masked(key: str) -> None:
    url = f"postgresql+psycopg2://alice@db:5432/t?sslmode=require&{key}=hunter2-q&application_name=tuner"
    assert mask_url(url) == f"postgresql+psycopg2://alice@db:5432/t?sslmode=require&{key}=***&application_name=tuner"
    assert has_secret(url)
    text_ = f'[study]\nstorage = "{url}"\n'
    assert "hunter2-q" not in mask_credentials(text_) and "sslmode=require" in mask_credentials(text_)
    assert "hunter2-q" not in scrub(f"connection to {url} failed: password hunter2-q rejected", url)


def test_userinfo_passwords_and_encoded_secrets_are_masked() -> None:
    url = "postgresql://alice:p%40ss-w0rd@db/t?token=a%2Bb"
    assert mask_url(url) == "postgresql://alice:***@db/t?token=***"
    scrubbed = scrub("auth failed for p@ss-w0rd with a+b (p%40ss-w0rd)", url)
    assert "p@ss" not in scrubbed and "a+b" not in scrubbed and "p%40ss" not in scrubbed
    assert not has_secret("postgresql://alice@db/t?sslmode=require") and not has_secret("sqlite:///x.db")
    assert (
        mask_credentials("see http://u:pw1@h/x and postgresql://v:pw2@h/y?pwd=pw3")
        == "see http://u:***@h/x and postgresql://v:***@h/y?pwd=***"
    )


def test_the_environment_of_a_process_without_database_work_has_no_credentials() -> None:
    env = {
        "PATH": "/bin",
        "TUNER_STORAGE": "postgresql://a:b@c/d",
        "PGPASSWORD": "x",
        "PGPASSFILE": "/p",
        "PGSSLKEY": "/k",
        "PGHOST": "db",
        "CUDA_VISIBLE_DEVICES": "0",
    }
    assert env_without_credentials(env) == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0"}


def test_a_password_in_the_url_query_is_never_printed_or_stored(write_spec, pg_url) -> None:
    secret = "qpw-5be2c1"
    url = f"{pg_url}?password={secret}&application_name=route-tuner-test"
    spec = write_spec(**{"study.storage": url, "run.budget": 1})
    run = tuner("run", str(spec), "--no-confirm", env=WIDE)
    assert run.returncode == 0, run.stderr
    shown = (
        tuner("status", str(spec), env=WIDE),
        tuner("status", str(spec), "--json"),
        tuner("status", str(spec), "--storage", url, env=WIDE),
    )
    missing = tuner("status", str(write_spec("other.toml", **{"study.name": "other", "study.storage": url})), env=WIDE)
    dump = all_rows_text(pg_url)
    for result in (run, *shown, missing):
        assert secret not in result.stdout + result.stderr
    assert secret not in dump
    assert all(result.returncode == 0 for result in shown), [r.stderr for r in shown]
    assert "password=***" in run.stderr  # `run` names its storage, masked
    assert missing.returncode == 2 and "password=***" in missing.stderr  # the error names the storage, masked
    assert "warning: --storage carries a password" in shown[2].stderr and "$TUNER_STORAGE" in shown[2].stderr
    assert "--storage carries a password" not in shown[0].stderr  # only a password on the command line is warned about
    assert "password=***&application_name=route-tuner-test" in dump  # the study file is stored, masked
