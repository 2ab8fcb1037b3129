"""Redis tables on a real Redis and Kafka: exact word counts, kill -9 bounds with and
without effectively-once, the server going down mid-turn, fencing, and the stack's
Redis keeping what they flushed across a kill -9 of the server."""
# ruff: noqa: PLR0917 - pytest passes fixtures positionally; tests take several

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from kasper_py import (
    Config,
    StoreError,
    TopicProcessor,
    stack,
)
from kasper_py.stores.base import StoreRuntime
from kasper_py.stores.redis import RedisTable

pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import (  # isort: skip  # noqa: E402 - after register_assert_rewrite
    OpenedCounts, RedisServer, TurnCounter, WORDS, assert_down_mid_turn_stops_uncommitted,
    check_discard_pending, free_port, kill_randomly_then_finish, produce_words,
    produce_words_and_a_delete, read_counts, store_config, worker_args)

pytest_plugins = ["conftest_stores"]
pytestmark = pytest.mark.integration

@pytest.mark.parametrize("effectively_once", [False, True])
def test_word_count_is_exact(bootstrap, new_topic, kafka, unique_name, redis_url,
                             effectively_once) -> None:
    """Counts over two partitions equal the input's, under ``<name>/counts/<p>/<word>``,
    deletes remove keys, and a turn costs at most two round trips per partition."""
    topic, name = new_topic("words", partitions=2), unique_name("redis-wc")
    produce_words_and_a_delete(kafka, topic, WORDS)
    factory = OpenedCounts()

    table = RedisTable("counts", url=redis_url, effectively_once=effectively_once)
    cfg, observer = store_config(bootstrap, name, topic), TurnCounter()
    processor = TopicProcessor(cfg, factory, stores=[table], observer=observer)
    processor.run_loop(until_caught_up=True)
    processor.close()
    counts = read_counts(RedisTable("counts", url=redis_url), cfg, 2, [*WORDS, "gone"])
    assert counts == Counter(WORDS)
    client = redis.Redis.from_url(redis_url)
    assert client.get(f"{name}/counts/0/w0") is not None
    assert not client.exists(f"{name}/counts/0/gone", f"{name}/counts/1/gone")
    # One MGET and one MULTI/EXEC (or EVALSHA) per partition per turn, plus the
    # effectively-once HGETALL of each partition's offsets when opened.
    opening = 2 if effectively_once else 0
    assert factory.round_trips <= 2 * 2 * observer.turns + opening
    if effectively_once:
        assert client.hgetall(f"{name}/counts#offsets/0") == {topic.encode(): b"1502"}


@pytest.mark.parametrize("effectively_once", [False, True])
def test_kill_minus_nine_never_undercounts(bootstrap, new_topic, kafka, unique_name, redis_url,
                                           effectively_once) -> None:
    """SIGKILL at random moments, then run to the end: no word is undercounted; the
    overcount is at most one batch per kill, and zero with effectively-once."""
    topic, name, batch_size, kills = new_topic("words", partitions=2), unique_name("kill"), 100, 3
    words = [f"w{i % 53}" for i in range(6000)]
    produce_words(kafka, topic, words, 2)
    options = ["--redis-url", redis_url, "--pause", "0.05"]
    args = worker_args("redis", bootstrap, name, topic, batch_size, *options,
                       *(["--effectively-once"] if effectively_once else []))
    kill_randomly_then_finish(
        args, kills, lambda: sum(o or 0 for o in kafka.committed(name, topic, 2).values()),
        len(words))
    counts = read_counts(RedisTable("counts", url=redis_url),
                         store_config(bootstrap, name, topic), 2, words)
    expected = Counter(words)
    assert all(counts[w] >= n for w, n in expected.items()), counts - expected
    overcount = sum(counts.values()) - len(words)
    if effectively_once:
        assert counts == expected
    else:
        assert overcount <= kills * batch_size, overcount
    assert sum(kafka.committed(name, topic, 2).values()) == len(words)


@pytest.mark.parametrize("effectively_once", [False, True])
def test_server_down_mid_turn_stops_uncommitted(bootstrap, new_topic, kafka, unique_name,
                                               dedicated_redis: RedisServer,
                                               effectively_once) -> None:
    """Redis stops between a turn's reads and its flush: the loop raises
    StoreUnavailableError naming the server, commits nothing of that batch, and once
    Redis is back a new run finishes with exact counts."""
    def table() -> RedisTable:
        return RedisTable("counts", url=dedicated_redis.url, effectively_once=effectively_once,
                          retries=2, backoff=0.05)

    assert_down_mid_turn_stops_uncommitted(
        kafka, bootstrap, new_topic("words"), unique_name("down"), spec=table,
        stop=dedicated_redis.stop, start=dedicated_redis.start,
        unreachable=f"redis {dedicated_redis.url} unreachable")


def test_effectively_once_fences_a_stale_writer(redis_url, unique_name) -> None:
    """A store whose offsets are stale (another process applied batches since it
    opened) is refused with a "fenced" StoreError and writes nothing; a batch whose
    offsets are already applied (a replay, or a retry whose reply was lost) is a no-op."""
    cfg = Config(name=unique_name("fence"), bootstrap_servers="unused:0", input_topics=["t"])
    specs = [RedisTable("counts", url=redis_url, effectively_once=True) for _ in range(3)]
    current, stale = (spec.open(StoreRuntime(cfg, 0)) for spec in specs[:2])
    current.put("k", 1)
    current.flush({("t", 0): 10})
    stale.put("k", 99)
    with pytest.raises(StoreError, match="fenced"):
        stale.flush({("t", 0): 20})
    replay = specs[2].open(StoreRuntime(cfg, 0))
    assert replay.applied_offsets() == {("t", 0): 10}
    replay.put("k", 1000)
    replay.flush({("t", 0): 10})
    assert replay.get("k") == 1
    for spec in specs:
        spec.close()


def kill_stack_redis(stack_dir: Path) -> None:
    """SIGKILL the stack's redis-server once its AOF holds every write (an fsync on a busy
    disk may hold the write back up to 2 s: the one case where a kill loses data)."""
    [status] = [s for s in stack.status(stack_dir) if s.name == "redis"]
    client = redis.Redis.from_url(f"redis://{status.address}/0")
    deadline = time.monotonic() + 10
    while client.info("persistence").get("aof_buffer_length", 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    client.close()
    assert status.pid is not None
    os.kill(status.pid, signal.SIGKILL)
    while any(s.running for s in stack.status(stack_dir)):
        assert time.monotonic() < deadline + 10, "redis-server outlived SIGKILL"
        time.sleep(0.05)


@pytest.mark.parametrize(("persistence", "kept"), [(None, True), ("none", False)])
def test_stack_redis_keeps_flushed_state_across_a_kill(tmp_path, monkeypatch, unique_name,
                                                       persistence, kept) -> None:
    """A second Redis started by the stack's own code (a temporary stack folder, a free
    port), killed with -9 after an effectively-once flush and started again, still holds
    the keys and the applied offsets: the append-only file is on by default.
    KASPER_REDIS_PERSISTENCE=none turns it off, and the restart forgets both."""
    monkeypatch.setenv("KASPER_REDIS_PORT", str(free_port()))
    if persistence is None:
        monkeypatch.delenv("KASPER_REDIS_PERSISTENCE", raising=False)
    else:
        monkeypatch.setenv("KASPER_REDIS_PERSISTENCE", persistence)
    cfg = Config(name=unique_name("persist"), bootstrap_servers="unused:0", input_topics=["t"])
    words = {f"w{i}": i for i in range(100)}

    def open_store(address: str) -> tuple[RedisTable, Any]:
        table = RedisTable("counts", url=f"redis://{address}/0", effectively_once=True)
        return table, table.open(StoreRuntime(cfg, 0))

    try:
        [started] = stack.up(["redis"], stack_dir=tmp_path)
        table, store = open_store(started.address)
        store.put_many(words)
        store.flush({("t", 0): 100})
        table.close()
        kill_stack_redis(tmp_path)
        [restarted] = stack.up(["redis"], stack_dir=tmp_path)
        table, store = open_store(restarted.address)
        assert store.applied_offsets() == ({("t", 0): 100} if kept else {})
        assert store.get_many(words) == (words if kept else {})
        table.close()
    finally:
        stack.down(["redis"], stack_dir=tmp_path)


def test_discard_pending_drops_buffered_writes(redis_url, unique_name) -> None:
    """Buffered writes dropped by discard_pending never reach the server."""
    cfg = Config(name=unique_name("discard"), bootstrap_servers="unused:0", input_topics=["t"])
    spec = RedisTable("counts", url=redis_url)
    check_discard_pending(spec, cfg)
    spec.close()


def test_exactly_once_with_effectively_once_redis(bootstrap, new_topic, kafka, unique_name,
                                                  redis_url) -> None:
    """Exactly-once outputs composed with an effectively-once Redis table, SIGKILL at
    random moments: the counts are exact, every input's output is visible to
    read_committed readers, and a repeated output comes whole with its batch (a crash
    between the transaction's commit and the store's write repeats one batch)."""
    topic, output = new_topic("words", partitions=2), new_topic("out", partitions=2)
    name, batch_size, kills = unique_name("eos-redis"), 100, 3
    words = [f"w{i % 53}" for i in range(6000)]
    for partition in (0, 1):
        kafka.produce(topic, [(str(i).encode(), words[i].encode())
                              for i in range(partition, len(words), 2)], partition=partition)
    args = worker_args("redis", bootstrap, name, topic, batch_size, "--redis-url", redis_url,
                       "--pause", "0.05", "--effectively-once", "--exactly-once",
                       "--output", output)
    kill_randomly_then_finish(
        args, kills, lambda: sum(o or 0 for o in kafka.committed(name, topic, 2).values()),
        len(words))
    counts = read_counts(RedisTable("counts", url=redis_url),
                         store_config(bootstrap, name, topic), 2, words)
    assert counts == Counter(words)
    seen = Counter(m.key() for m in kafka.read_all(output))
    assert set(seen) == {str(i).encode() for i in range(len(words))}
    assert sum(seen.values()) - len(words) <= kills * batch_size
    assert sum(kafka.committed(name, topic, 2).values()) == len(words)
