"""The proxy's PostgreSQL watch: a connection broken after its COMMIT reached the server, before the reply."""

from __future__ import annotations

import psycopg2
import pytest

from tests.pg_faults import Watch
from tests.proxy import in_front_of


def test_a_commit_of_an_armed_step_is_done_but_its_reply_never_arrives(pg_url: str) -> None:
    direct = psycopg2.connect(pg_url)
    direct.autocommit = True
    with direct.cursor() as cur:
        cur.execute("CREATE TABLE tuner_results (key text PRIMARY KEY)")
    watch = Watch()
    proxy, through = in_front_of(pg_url, watch)
    try:
        conn = psycopg2.connect(through)
        with conn.cursor() as cur:
            cur.execute("SELECT 1")  # not armed yet: passes
        conn.commit()
        watch.drop_after_commit("record", "tell")
        with conn.cursor() as cur:
            cur.execute("INSERT INTO tuner_results VALUES ('a')")
        with pytest.raises(psycopg2.OperationalError):
            conn.commit()  # the server committed; the client only sees its connection break
        again = psycopg2.connect(through)
        with again.cursor() as cur:
            cur.execute("INSERT INTO tuner_results VALUES ('b')")
        again.commit()  # each step breaks once
        again.close()
    finally:
        proxy.cut()
    with direct.cursor() as cur:
        cur.execute("SELECT key FROM tuner_results ORDER BY key")
        assert [r[0] for r in cur.fetchall()] == ["a", "b"]
    direct.close()
    assert set(watch.dropped) == {"record"} and watch.armed == {"tell"}
