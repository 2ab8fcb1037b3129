"""Tables with a time to live on the real servers: Redis sets its own expiry on every
written key (``SET ... PX``), Cassandra writes ``USING TTL``; the effectively-once
offsets never expire."""

from __future__ import annotations

import time

import pytest
import redis

from kasper_py import Config
from kasper_py.stores.base import StoreRuntime
from kasper_py.stores.cassandra import CassandraTable
from kasper_py.stores.redis import RedisTable

pytest_plugins = ["conftest_stores"]
pytestmark = pytest.mark.integration


@pytest.mark.parametrize("effectively_once", [False, True])
def test_redis_keys_expire_and_the_offsets_stay(redis_url, unique_name,
                                                effectively_once: bool) -> None:
    """Every key written carries Redis' expiry of ttl (PTTL between 0 and ttl), a rewrite
    renews it, and the key is gone once it passed; the offsets hash has none."""
    cfg = Config(name=unique_name("ttl"), bootstrap_servers="unused:0", input_topics=["t"])
    spec = RedisTable("seen", url=redis_url, effectively_once=effectively_once, ttl=2.0)
    store = spec.open(StoreRuntime(cfg, 0))
    store.put_many({"a": 1, "b": 2})
    store.flush({("t", 0): 2})
    client = redis.Redis.from_url(redis_url)
    prefix = f"{cfg.name}/seen/0/"
    assert 0 < client.pttl(prefix + "a") <= 2000
    time.sleep(1.2)
    store.put("a", 3)
    store.flush({("t", 0): 3})
    time.sleep(1.2)
    assert store.get_many(["a", "b"]) == {"a": 3}
    if effectively_once:
        assert client.pttl(store.offsets_key) == -1  # no expiry
        assert spec.open(StoreRuntime(cfg, 0)).applied_offsets() == {("t", 0): 3}
    client.close()
    spec.close()


@pytest.mark.cassandra
def test_cassandra_values_are_written_using_ttl(cassandra_contact, unique_name) -> None:
    """Each value is written USING TTL (TTL(value) between 0 and ttl), a rewrite renews
    it, an expired key reads as absent, and the effectively-once offsets stay (the
    conditional batch takes the same UPDATE as a plain one). Cassandra counts TTL in
    whole seconds from the write's second, hence the margins."""
    effectively_once = True
    host, port = cassandra_contact
    cfg = Config(name=unique_name("ttl"), bootstrap_servers="unused:0", input_topics=["t"])
    spec = CassandraTable("seen", contact_points=[host], port=port, keyspace="kasper_tests",
                          effectively_once=effectively_once, ttl=4)
    store = spec.open(StoreRuntime(cfg, 0))
    store.put_many({"a": 1, "b": 2})
    store.flush({("t", 0): 2})
    session = spec._session
    [row] = session.execute(f"SELECT TTL(value) FROM kasper_tests.{spec.table} WHERE "
                            "prefix = %s AND partition = 0 AND key = %s", (cfg.name, b"a"))
    assert 0 < row[0] <= 4
    time.sleep(2.0)  # b expires in (3 s, 4 s], a rewritten now in (5 s, 6 s]
    store.put("a", 3)
    store.flush({("t", 0): 3})
    time.sleep(2.3)
    assert store.get_many(["a", "b"]) == {"a": 3}
    if effectively_once:
        assert spec.open(StoreRuntime(cfg, 0)).applied_offsets() == {("t", 0): 3}
    spec.close()
