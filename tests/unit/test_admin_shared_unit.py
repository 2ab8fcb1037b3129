"""One AdminClient per process and connection, with no broker: every ``KafkaAdmin``
of a connection (whatever the processor's name) shares it; another connection, or
other client settings, get their own; a forked child makes its own."""

from __future__ import annotations

import os

from kasper_py import Config
from kasper_py.kafka.admin import KafkaAdmin, close_shared, shared_client


def config(name: str, servers: str = "127.0.0.1:1", **fields: object) -> Config:
    return Config(name=name, bootstrap_servers=servers, input_topics=["in"], **fields)  # type: ignore[arg-type]


def test_one_admin_client_per_connection() -> None:
    """Two processors' admins on one cluster share one AdminClient and one error list;
    other servers or other security settings make another."""
    close_shared()
    first, errors = shared_client(config("a"))
    assert shared_client(config("b")) == (first, errors)
    with KafkaAdmin(config("c"), consumer=False) as admin:
        assert admin.errors is errors
    assert shared_client(config("a", "127.0.0.1:2"))[0] is not first
    secured = config("a", client_overrides={"security.protocol": "ssl"})
    assert shared_client(secured)[0] is not first
    close_shared()
    assert shared_client(config("a"))[0] is not first


def test_a_forked_child_makes_its_own() -> None:
    """librdkafka's threads do not survive a fork: the child does not reuse the
    parent's client."""
    close_shared()
    parent = shared_client(config("a"))[0]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report whether it got a new client, then leave at once
        same = shared_client(config("a"))[0] is parent
        os.write(write, b"same" if same else b"new")
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 10) == b"new"
