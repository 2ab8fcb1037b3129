"""Stores name their server in errors without the URL's credentials."""

from __future__ import annotations

from kasper_py._support.urls import server_address
from kasper_py.stores.postgres import PostgresTable
from kasper_py.stores.redis import RedisTable


def test_credentials_are_left_out_and_the_default_port_filled_in() -> None:
    assert server_address("redis://u:secret@cache/3", 6379) == "redis://cache:6379/3"
    assert server_address("https://admin:pw@search:9201/x", 9200,
                          with_path=False) == "https://search:9201"
    assert server_address("postgres://app:pw@db/orders", 5432,
                          scheme="postgresql") == "postgresql://db:5432/orders"


def test_stores_report_their_address_without_the_password() -> None:
    redis_table = RedisTable("counts", url="redis://u:hunter2@127.0.0.1:16379/0")
    assert redis_table.address == "redis://127.0.0.1:16379/0"
    pg_table = PostgresTable("counts", url="postgresql://app:hunter2@127.0.0.1/kasper")
    assert pg_table.address == "postgresql://127.0.0.1:5432/kasper"
