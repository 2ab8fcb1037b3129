"""``Stream.drop_duplicates``: each id's first record within the window passes, by
the record key or an id taken from the value, across partitions after a re-key, and
restored from the changelog on another machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kasper_py import Config
from kasper_py.app import App
from kasper_py.dsl import Builder
from kasper_py.testing import ProcessorDriver, make_message
from kasper_py.testing.changelog import MemoryChangelogs


def _app(key: Any = None, rekey: bool = False, stores: str = "memory") -> App:
    b = Builder("dedup", stores=stores)  # type: ignore[arg-type]
    stream = b.stream("in")
    if rekey:
        stream = stream.select_key(lambda k, v: v["id"])
    stream.drop_duplicates(10, "seen", key=key).to("out")
    return b.build()


def _sent(driver: ProcessorDriver) -> list[tuple[Any, Any, int | None]]:
    return [(json.loads(m.key), json.loads(m.value), m.timestamp) for m in driver.sent
            if m.topic == "out"]


def test_the_first_record_of_each_key_within_the_window_passes() -> None:
    """a@1 ms and b@1 s pass, a@4 s and b@8 s drop, a@12 s passes (past a's 10 s);
    b@20 s passes: stream time passed b's window, which is forgotten."""
    driver = ProcessorDriver(_app(), key_serde="json", value_serde="json")
    records = [("a", 1, 1), ("b", 2, 1000), ("a", 3, 4000), ("b", 5, 8000), ("a", 4, 12_000),
               ("b", 6, 20_000)]
    driver.process([make_message("in", v, k, timestamp=t) for k, v, t in records[:3]])
    driver.process([make_message("in", v, k, timestamp=t) for k, v, t in records[3:]])
    assert _sent(driver) == [("a", 1, 1), ("b", 2, 1000), ("a", 4, 12_000), ("b", 6, 20_000)]


def test_an_id_from_the_value() -> None:
    """key= takes the id from the value: two keys with one id count as one."""
    driver = ProcessorDriver(_app(key=lambda k, v: v["id"]), key_serde="json",
                             value_serde="json")
    driver.process([make_message("in", {"id": 7, "n": n}, "k", timestamp=n) for n in (1, 2)])
    assert _sent(driver) == [("k", {"id": 7, "n": 1}, 1)]


def test_a_rekeyed_stream_is_repartitioned_before_deduplication() -> None:
    """Records of one id arriving on two partitions meet after the repartition: one
    passes."""
    driver = ProcessorDriver(_app(rekey=True), key_serde="json", value_serde="json",
                             partitions=2)
    driver.process([make_message("in", {"id": 7, "p": p}, f"k{p}", partition=p, timestamp=p + 1)
                    for p in (0, 1)])
    assert [value for _, value, _ in _sent(driver)] in ([{"id": 7, "p": 0}], [{"id": 7, "p": 1}])


def test_a_restore_on_another_machine_still_drops_the_repeats(tmp_path: Path) -> None:
    """RocksDB: a driver on a fresh state_dir with the changelogs drops a repeat of an id
    the first one let through."""
    changelogs = MemoryChangelogs()

    def config(folder: str) -> Config:
        return Config(name="dedup", bootstrap_servers="in-memory:0", input_topics=["in"],
                      key_serde="json", value_serde="json", state_dir=str(tmp_path / folder))

    first = ProcessorDriver(_app(stores="rocksdb"), config=config("a"), changelogs=changelogs)
    first.process([make_message("in", 1, "a", timestamp=1)])
    first.close()
    second = ProcessorDriver(_app(stores="rocksdb"), config=config("b"), changelogs=changelogs)
    second.process([make_message("in", 2, "a", timestamp=5000),
                    make_message("in", 3, "b", timestamp=5000)])
    assert _sent(second) == [("b", 3, 5000)]
    second.close()
