"""A RocksDB table with a time to live on a real Kafka: a restore after the folder is
deleted holds no expired key (expiry is computed again from the changelog records'
timestamps), and the first turn after expiry writes tombstones, so even a table read
without a ttl never gets the expired keys back; a key dated 0 by event time keeps its
date through a restore (Kafka stamps a record produced with timestamp 0 with its clock)."""

from __future__ import annotations

import shutil
import time
from collections import Counter
from typing import Any

import pytest

from kasper_py.kafka.producer import OutputProducer
from kasper_py.stores.base import StoreRuntime
from kasper_py.stores.rocksdb import RocksDBTable
from kasper_py.stores.ttl import Ttl

pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import (  # isort: skip  # noqa: E402 - after register_assert_rewrite
    produce_words, read_counts, run_until_caught_up, store_config)

pytest_plugins = ["conftest_stores"]
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("delete_changelogs")]

TTL = 6.0
OLD, NEW = ["old1", "old2", "old1"], ["new1", "new2"]


def test_a_restored_ttl_table_holds_no_expired_key(bootstrap, new_topic, kafka, unique_name,
                                                   tmp_path) -> None:
    """Old words counted, then the ttl passes with no turn: a restore from the changelog
    alone (folder deleted) reads none of them. New words counted next: that run's first
    turn tombstones the old ones, and a plain restore (no ttl) holds the new words only."""
    topic, name = new_topic("words", partitions=2), unique_name("ttl")
    cfg = store_config(bootstrap, name, topic, state_dir=str(tmp_path))
    produce_words(kafka, topic, OLD, 2)
    run_until_caught_up(cfg, RocksDBTable("counts", ttl=TTL))
    assert read_counts(RocksDBTable("counts", ttl=TTL), cfg, 2, OLD) == Counter(OLD)
    time.sleep(TTL + 0.2)
    shutil.rmtree(tmp_path / name)
    assert read_counts(RocksDBTable("counts", ttl=TTL), cfg, 2, OLD) == Counter()
    produce_words(kafka, topic, NEW, 2)
    run_until_caught_up(cfg, RocksDBTable("counts", ttl=TTL))
    shutil.rmtree(tmp_path / name)
    assert read_counts(RocksDBTable("counts"), cfg, 2, [*OLD, *NEW]) == Counter(NEW)


def test_a_key_dated_0_by_event_time_is_restored_with_date_0(bootstrap, new_topic,
                                                             unique_name, tmp_path) -> None:
    """A key written at stream time 0, restored from the changelog alone: it is still
    live at stream time 9,999 and expired at 10,000 (ttl 10 s), as it was before the
    restore, not dated with the wall clock the producer stamps on timestamp 0."""
    topic, name = new_topic("in"), unique_name("ttl-zero")
    changelog = new_topic("ttl-zero-changelog", **{"cleanup.policy": "compact"})
    cfg = store_config(bootstrap, name, topic, state_dir=str(tmp_path))
    producer = OutputProducer(cfg)

    def opened(stream_time: int) -> tuple[RocksDBTable, Any]:
        shutil.rmtree(tmp_path / name, ignore_errors=True)  # restore from the changelog
        table = RocksDBTable("zero", changelog_topic=changelog, ttl=Ttl(10, by="event"))
        runtime = StoreRuntime(cfg, 0, producer, stream_time=lambda: stream_time)
        return table, table.open(runtime)

    try:
        table, store = opened(0)
        store.put_many({"a": 1})
        store.flush({})
        producer.wait_for_acks()
        store.after_delivery()
        for stream_time, live in ((9_999, {"a": 1}), (10_000, {})):
            store.close()
            table.close()
            table, store = opened(stream_time)
            assert store.get_many(["a"]) == live, stream_time
        store.close()
        table.close()
    finally:
        producer.close()
