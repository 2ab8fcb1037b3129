"""``ProcessorDriver`` with a RocksDB table and its changelog, held in memory: the
changelog records each turn's writes (out of ``sent``), and a driver given those
changelogs and no local files restores the table, under both guarantees."""

from __future__ import annotations

from pathlib import Path

import pytest

from kasper_py import Config, Message, MessageProcessor, Sender
from kasper_py.stores.rocksdb import RocksDBTable
from kasper_py.testing import ProcessorDriver, make_message

CHANGELOG = "wc-counts-changelog"


class WordCount(MessageProcessor):
    """Counts words in the RocksDB table "counts"; sends each changed count."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        counts = self.context.store("counts")
        words = [word for m in messages for word in m.value.split()]
        totals = counts.get_many(set(words))
        for word in words:
            totals[word] = totals.get(word, 0) + 1
        counts.put_many(totals)
        for word, count in sorted(totals.items()):
            sender.send("counts", str(count), key=word)


def _driver(state_dir: Path, guarantee: str, **options: object) -> ProcessorDriver:
    config = Config(name="wc", bootstrap_servers="unused:9092", input_topics=["lines"],
                    key_serde="str", value_serde="str", state_dir=str(state_dir),
                    processing_guarantee=guarantee)  # type: ignore[arg-type]
    return ProcessorDriver(WordCount, config=config, stores=[RocksDBTable("counts")],
                           **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_the_changelog_is_kept_in_memory_and_restores(tmp_path: Path, guarantee: str
                                                      ) -> None:
    """Two turns: the changelog holds each turn's writes, turn by turn; no output shows
    them; a driver on an empty state_dir with those changelogs restores every count and
    goes on from them; one on the same state_dir reads its own files."""
    driver = _driver(tmp_path / "a", guarantee)
    driver.process([make_message("lines", "a b a")])
    driver.process([make_message("lines", "b c")])
    assert driver.outputs() == [("a", "2"), ("b", "1"), ("b", "2"), ("c", "1")]
    assert {m.topic for m in driver.sent} == {"counts"}
    first, second = driver.changelogs.records(CHANGELOG)[:2], \
        driver.changelogs.records(CHANGELOG)[2:]  # within a turn, in the table's order
    assert (sorted(first), sorted(second)) == ([(b"a", b"2"), (b"b", b"1")],
                                               [(b"b", b"2"), (b"c", b"1")])
    elsewhere = _driver(tmp_path / "b", guarantee, changelogs=driver.changelogs)
    assert dict(elsewhere.store("counts").items()) == {"a": 2, "b": 2, "c": 1}
    elsewhere.process([make_message("lines", "c a")])
    assert elsewhere.outputs() == [("a", "3"), ("c", "2")]
    assert sorted(driver.changelogs.records(CHANGELOG)[-2:]) == [(b"a", b"3"), (b"c", b"2")]
    driver.close()
    elsewhere.close()
    same_disk = _driver(tmp_path / "b", guarantee, changelogs=driver.changelogs)
    assert dict(same_disk.store("counts").items()) == {"a": 3, "b": 2, "c": 2}
    same_disk.close()


def test_a_failed_turn_writes_no_changelog(tmp_path: Path) -> None:
    """A turn whose processor raises leaves the changelog and the table as they were."""
    driver = _driver(tmp_path, "at_least_once")
    driver.process([make_message("lines", "a")])
    with pytest.raises(Exception, match="has no attribute 'split'"):
        driver.process([make_message("lines", 42)])
    assert driver.changelogs.records(CHANGELOG) == [(b"a", b"1")]
    assert dict(driver.store("counts").items()) == {"a": 1}
    driver.close()
