"""A RocksDB table with a time to live on a real Kafka: a restore after the folder is
deleted holds no expired key (expiry is computed again from the changelog records'
timestamps), and the first turn after expiry writes tombstones, so even a table read
without a ttl never gets the expired keys back."""

from __future__ import annotations

import shutil
import time
from collections import Counter

import pytest

from kasper_py.stores.rocksdb import RocksDBTable

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
