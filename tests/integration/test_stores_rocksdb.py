"""Local RocksDB tables on a real Kafka: exact counts and their changelog, restores after
the folder is deleted or left behind, kill -9 bounds, a failed changelog write, global
tables kept current between batches, and JSON tables readable across the serde's short
paths (a changelog an older version wrote restores identically, and the other way)."""


from __future__ import annotations

import json
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import ConfigResource
from structlog.testing import capture_logs

from kasper_py import (
    Config,
    Message,
    MessageProcessor,
    ProcessorContext,
    ProduceError,
    Sender,
    TopicProcessor,
)
from kasper_py.kafka.producer import OutputProducer
from kasper_py.stores.base import StoreRuntime
from kasper_py.stores.rocksdb import LocalDB, RocksDBTable
from tests.kafka_clients import AdminClient

pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import (  # isort: skip  # noqa: E402 - after register_assert_rewrite
    OpenedCounts, TurnCounter, WORDS, kill_randomly_then_finish, produce_words,
    produce_words_and_a_delete, read_counts, run_until_caught_up, store_config, wait_for,
    worker_args)
from stores_worker import WordCount  # isort: skip  # noqa: E402

pytest_plugins = ["conftest_stores"]
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("delete_changelogs")]

def config(bootstrap: str, name: str, topic: str, state_dir: Path, **kwargs: Any) -> Config:
    return store_config(bootstrap, name, topic, state_dir=str(state_dir), **kwargs)


def run(cfg: Config, processor_class: Any = WordCount, table: RocksDBTable | None = None,
        **kwargs: Any) -> None:
    run_until_caught_up(cfg, table or RocksDBTable("counts"), processor_class, **kwargs)


def test_word_count_is_exact_and_mirrored_in_a_compacted_changelog(
        bootstrap, new_topic, kafka, unique_name, tmp_path) -> None:
    """Counts equal the input's; the changelog ``<name>-counts-changelog`` is created
    compacted with the input's partition count, holds every write (deletes as
    tombstones) on the write's partition, and its latest values equal the table."""
    topic, name = new_topic("words", partitions=2), unique_name("rocks-wc")
    produce_words_and_a_delete(kafka, topic, WORDS)
    factory = OpenedCounts()

    cfg, observer = config(bootstrap, name, topic, tmp_path), TurnCounter()
    run(cfg, factory, observer=observer)
    # One MultiGet and one WriteBatch per partition per turn; the changelog produce
    # waits with the loop's outputs and adds no round trip of its own.
    assert factory.round_trips <= 2 * 2 * observer.turns
    assert read_counts(RocksDBTable("counts"), cfg, 2, [*WORDS, "gone"]) == Counter(WORDS)
    changelog = f"{name}-counts-changelog"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    assert len(admin.list_topics(changelog, timeout=30).topics[changelog].partitions) == 2
    resource = ConfigResource("topic", changelog)
    settings = admin.describe_configs([resource])[resource].result(30)
    assert settings["cleanup.policy"].value == "compact"
    latest: dict[tuple[int, bytes], bytes | None] = {}
    records = kafka.read_all(changelog)
    for record in records:
        latest[(record.partition(), record.key())] = record.value()
    assert latest[(0, b"gone")] is None
    totals: Counter[str] = Counter()
    for (_, key), value in latest.items():
        if value is not None:
            totals[key.decode()] += int(value)
    assert totals == Counter(WORDS)
    per_partition = Counter(record.partition() for record in records)
    for partition in (0, 1):
        db = LocalDB(tmp_path / name / "counts" / str(partition))
        assert db.changelog_offset(partition) == per_partition[partition]
        db.close()


def test_deleted_folder_is_restored_from_the_changelog(bootstrap, new_topic, kafka,
                                                      unique_name, tmp_path) -> None:
    """Delete the state folder and restart: the restored table equals the table before,
    restore progress is logged, and processing carries on from it."""
    topic, name = new_topic("words", partitions=2), unique_name("restore")
    produce_words(kafka, topic, WORDS, 2)
    cfg = config(bootstrap, name, topic, tmp_path)
    run(cfg)
    before = read_counts(RocksDBTable("counts"), cfg, 2, WORDS)
    assert before == Counter(WORDS)
    shutil.rmtree(tmp_path / name)
    with capture_logs() as logs:
        after = read_counts(RocksDBTable("counts"), cfg, 2, WORDS)
    assert after == before
    done = [e for e in logs if e["event"] == "kasper.restore_done"]
    started = [e for e in logs if e["event"] == "kasper.restore_started"]
    assert {e["reason"] for e in started} == {"missing"} and len(done) == 2
    assert sum(e["applied"] for e in done) == sum(e["records"] for e in started) > 0
    shutil.rmtree(tmp_path / name)
    produce_words(kafka, topic, ["w0", "new"], 2)
    run(cfg)
    assert read_counts(RocksDBTable("counts"), cfg, 2, [*WORDS, "new"]) == Counter(
        [*WORDS, "w0", "new"])


def test_folder_behind_its_changelog_reads_only_the_tail(bootstrap, new_topic, kafka,
                                                        unique_name, tmp_path) -> None:
    """Files older than the changelog (restored from a backup, or a crash after the
    acks) resume from their recorded offset and end equal to the changelog."""
    topic, name = new_topic("words"), unique_name("behind")
    produce_words(kafka, topic, WORDS[:1000], 1)
    cfg = config(bootstrap, name, topic, tmp_path)
    run(cfg)
    shutil.copytree(tmp_path / name, tmp_path / "backup")
    produce_words(kafka, topic, WORDS[1000:], 1)
    run(cfg)
    shutil.rmtree(tmp_path / name)
    shutil.copytree(tmp_path / "backup", tmp_path / name)
    with capture_logs() as logs:
        counts = read_counts(RocksDBTable("counts"), cfg, 1, WORDS)
    assert counts == Counter(WORDS)
    started = [e for e in logs if e["event"] == "kasper.restore_started"]
    assert [e["reason"] for e in started] == ["behind"]
    first, end = started[0]["partitions"][0]
    assert 0 < first < end


def test_kill_minus_nine_never_undercounts(bootstrap, new_topic, kafka, unique_name,
                                           tmp_path) -> None:
    """SIGKILL at random moments, then run to the end: no word is undercounted, the
    overcount is at most one batch per kill, and the changelog agrees with the files."""
    topic, name, batch_size, kills = new_topic("words", partitions=2), unique_name("kill"), 100, 3
    words = [f"w{i % 53}" for i in range(6000)]
    produce_words(kafka, topic, words, 2)
    args = worker_args("rocksdb", bootstrap, name, topic, batch_size, "--state-dir",
                       str(tmp_path), "--pause", "0.05")
    kill_randomly_then_finish(
        args, kills, lambda: sum(o or 0 for o in kafka.committed(name, topic, 2).values()),
        len(words))
    cfg = config(bootstrap, name, topic, tmp_path)
    counts = read_counts(RocksDBTable("counts"), cfg, 2, words)
    expected = Counter(words)
    assert all(counts[w] >= n for w, n in expected.items()), expected - counts
    assert sum(counts.values()) - len(words) <= kills * batch_size
    shutil.rmtree(tmp_path / name)
    assert read_counts(RocksDBTable("counts"), cfg, 2, words) == counts


class BigValue(MessageProcessor):
    def __init__(self, context: ProcessorContext) -> None:
        self.counts = context.store("counts")

    def process(self, messages: list[Message], sender: Sender) -> None:
        self.counts.put_many({m.value: "x" * 500 for m in messages})


def test_failed_changelog_write_is_not_committed_nor_applied(bootstrap, new_topic, kafka,
                                                            unique_name, tmp_path) -> None:
    """A changelog record the broker refuses fails the turn with ProduceError: the
    input offset is not committed and the local files do not take the write."""
    topic, name = new_topic("words"), unique_name("refused")
    changelog = new_topic("changelog", **{"cleanup.policy": "compact",
                                          "max.message.bytes": "200"})
    kafka.produce(topic, [b"a", b"b"])
    cfg = config(bootstrap, name, topic, tmp_path)
    processor = TopicProcessor(cfg, BigValue,
                               stores=[RocksDBTable("counts", changelog_topic=changelog)])
    with pytest.raises(ProduceError) as info:
        processor.run_loop(until_caught_up=True)
    assert f"delivery to {changelog}[0] failed" in str(info.value)
    assert kafka.committed(name, topic) == {0: None}
    db = LocalDB(tmp_path / name / "counts" / "0")
    # the restore of the empty changelog recorded position 0; the refused write left it
    assert list(db.items()) == [] and db.changelog_offset(0) == 0
    db.close()


class Upsert(MessageProcessor):
    """Writes each message's key -> value into "profiles"."""

    def __init__(self, context: ProcessorContext) -> None:
        self.profiles = context.store("profiles")

    def process(self, messages: list[Message], sender: Sender) -> None:
        self.profiles.put_many({m.key: m.value for m in messages})


class Lookup(MessageProcessor):
    """Looks every message's value up in "profiles"; appends the answers to ``seen``."""

    def __init__(self, context: ProcessorContext, seen: list[dict[str, Any]]) -> None:
        self.profiles = context.store("profiles")
        self.seen = seen

    def process(self, messages: list[Message], sender: Sender) -> None:
        self.seen.append(self.profiles.get_many([m.value for m in messages]))


def test_global_table_holds_every_partition_and_stays_current(bootstrap, new_topic, kafka,
                                                              unique_name, tmp_path) -> None:
    """A global table of another processor's changelog holds the keys of all its
    partitions, and a running processor sees that changelog's new writes on a later
    batch, without a restart."""
    users, lookups = new_topic("users", partitions=3), new_topic("lookups")
    owner = config(bootstrap, unique_name("owner"), users, tmp_path, key_serde="str")
    kafka.produce(users, [(f"u{i}".encode(), f"name{i}".encode()) for i in range(12)])
    run(owner, Upsert, table=RocksDBTable("profiles"))
    seen: list[dict[str, Any]] = []
    table = RocksDBTable("profiles", global_table=True,
                         changelog_topic=f"{owner.name}-profiles-changelog")
    reader = TopicProcessor(config(bootstrap, unique_name("reader"), lookups, tmp_path),
                            lambda c: Lookup(c, seen), stores=[table])
    loop = threading.Thread(target=reader.run_loop)
    loop.start()
    try:
        kafka.produce(lookups, [f"u{i}".encode() for i in range(12)])
        wait_for(lambda: sum(len(s) for s in seen) == 12)
        assert {k: v for s in seen for k, v in s.items()} == {
            f"u{i}": f"name{i}" for i in range(12)}
        kafka.produce(users, [(b"u3", b"renamed"), (b"u12", b"newcomer")])
        run(owner, Upsert, table=RocksDBTable("profiles"))

        def renamed_seen() -> bool:
            # The reader follows the changelog in the background; ask until it shows.
            if seen and seen[-1] == {"u3": "renamed", "u12": "newcomer"}:
                return True
            kafka.produce(lookups, [b"u3", b"u12"])
            time.sleep(0.3)
            return False

        wait_for(renamed_seen)
    finally:
        reader.close(timeout=30)
        loop.join(30)




def test_global_table_with_empty_changelog_partitions_is_not_reread(
        bootstrap, new_topic, kafka, unique_name, tmp_path) -> None:
    """Only partition 0 of a 3-partition changelog has records. The first start restores
    them; the second start, with its folder in place, restores nothing (empty partitions
    used to read as "missing" and wipe the whole table every start)."""
    users, lookups = new_topic("users", partitions=3), new_topic("lookups")
    owner = config(bootstrap, unique_name("owner"), users, tmp_path, key_serde="str")
    kafka.produce(users, [(f"u{i}".encode(), f"name{i}".encode()) for i in range(5)],
                  partition=0)
    run(owner, Upsert, table=RocksDBTable("profiles"))
    reader = config(bootstrap, unique_name("reader"), lookups, tmp_path)

    def restored_on_start() -> list[int]:
        kafka.produce(lookups, [b"u1"])
        seen: list[dict[str, Any]] = []
        table = RocksDBTable("profiles", global_table=True,
                             changelog_topic=f"{owner.name}-profiles-changelog")
        with capture_logs() as logs:
            run_until_caught_up(reader, table, lambda c: Lookup(c, seen))
        assert seen and seen[0] == {"u1": "name1"}
        return [e["records"] for e in logs if e["event"] == "kasper.restore_started"]

    assert restored_on_start() == [5]
    assert restored_on_start() == []


OLD_ROWS: dict[Any, Any] = {
    "plain": 1, "ünï 日本": {"nested": ["x", 2.5, None]}, 'quo"te\\': "value \u2028 \x00",
    "big": 10**30, "neg": -7, "yes": True, "float": 0.1 + 0.2, 12: "an int key", "": [],
}
NEW_ROWS: dict[Any, Any] = {"plain": 2, "emoji 😀": "ok", 7: -0.0, "big": 10**31}


def _old_json(value: Any) -> bytes:
    """How the JSON serde wrote before its short paths (json.dumps, compact)."""
    return json.dumps(value, separators=(",", ":")).encode()


def test_a_json_table_reads_a_changelog_written_by_the_old_encoder_and_the_other_way(
        bootstrap, new_topic, kafka, unique_name, tmp_path) -> None:
    """A JSON-keyed, JSON-valued table restored from a changelog of json.dumps records
    (as an older version wrote it) reads every row back; its own writes reach the
    changelog as json.dumps's bytes (so an older version restoring from it reads them),
    and a restore of the whole changelog from scratch reads old and new rows alike."""
    topic, name = new_topic("in"), unique_name("json-compat")
    changelog = new_topic("json-compat-changelog", **{"cleanup.policy": "compact"})
    kafka.produce(changelog, [(_old_json(k), _old_json(v)) for k, v in OLD_ROWS.items()],
                  partition=0)
    cfg = config(bootstrap, name, topic, tmp_path)
    producer = OutputProducer(cfg)
    try:
        table = RocksDBTable("compat", key_serde="json", value_serde="json",
                             changelog_topic=changelog)
        store = table.open(StoreRuntime(cfg, 0, producer))
        assert store.get_many(list(OLD_ROWS)) == OLD_ROWS
        assert {type(v) for v in store.get_many(["yes", "big", "float"]).values()} == {
            bool, int, float}
        store.put_many(NEW_ROWS)
        store.flush({})
        producer.wait_for_acks()
        store.after_delivery()
        store.close()
        table.close()
        written = kafka.read_all(changelog)[len(OLD_ROWS):]
        assert [(m.key(), m.value()) for m in written] == [
            (_old_json(k), _old_json(v)) for k, v in NEW_ROWS.items()]
        assert {json.loads(m.key()): json.loads(m.value()) for m in written} == NEW_ROWS
        shutil.rmtree(tmp_path / name)
        restored = RocksDBTable("compat", key_serde="json", value_serde="json",
                                changelog_topic=changelog)
        store = restored.open(StoreRuntime(cfg, 0, producer))
        assert store.get_many([*OLD_ROWS, *NEW_ROWS]) == {**OLD_ROWS, **NEW_ROWS}
        store.close()
        restored.close()
    finally:
        producer.close()
