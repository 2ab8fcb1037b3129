"""Co-partitioned inputs aligned by timestamp (``Config.max_task_idle``): a partition
number's batch waits for an input with records known to wait on the broker, ends at the
common timestamp frontier (the rest held, in order, for the next batch), is released by
the idle bound, and is never held by a caught-up input; revoked partitions' held records
are dropped; one input topic is gathered as before. On a ``Collector`` with a scripted
consume and lag, and in the real loop on the in-memory broker."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import pytest
from confluent_kafka import Message as RawMessage
from structlog.testing import capture_logs

from kasper_py import Config, ConfigError, Message, MessageProcessor, Sender, TopicProcessor
from kasper_py.cli.base import EXIT_CONFIG, load_config
from kasper_py.kafka.alignment import SLOW_FETCH, UNALIGNED, TimestampAlignment
from kasper_py.kafka.batching import Collector
from kasper_py.loop.prefetch import Prefetcher
from kasper_py.message import TopicPartitionKey
from kasper_py.testing import InMemoryBroker
from kasper_py.testing.memory_cluster import Commit
from tests.unit.test_cli_unit import kasper


def raw(topic: str, partition: int, offset: int, timestamp: int) -> RawMessage:
    return RawMessage(topic=topic, partition=partition, offset=offset, key=None,
                      value=b"v", timestamp=(1, timestamp))


class Script:
    """A consume that hands out one scripted list of records per call (an empty one, or
    nothing once the script is over, after moving the clock on by the timeout: the batch
    wait ends), and lags the test sets."""

    def __init__(self, calls: list[list[RawMessage]]) -> None:
        self.calls, self.now = list(calls), 0.0
        self.lag: dict[TopicPartitionKey, int | None] = {}
        self.held_back: set[TopicPartitionKey] = set()
        """Topic-partitions the alignment told the consumer not to fetch for now."""

    def clock(self) -> float:
        return self.now

    def consume(self, max_count: int, timeout: float) -> Sequence[RawMessage]:
        records = self.calls.pop(0) if self.calls else []
        if not records:
            self.now += timeout
        return records

    def lags(self, keys: Collection[TopicPartitionKey]) -> dict[TopicPartitionKey, int | None]:
        return {key: self.lag.get(key, 0) for key in keys}

    def hold_back(self, keys: Collection[TopicPartitionKey]) -> None:
        self.held_back.update(keys)

    def read_on(self, keys: Collection[TopicPartitionKey]) -> None:
        self.held_back.difference_update(keys)


def collector(script: Script, size: int = 100, idle: float = 0.0,
              most: int = 1000) -> Collector:
    alignment = TimestampAlignment(["users", "clicks"], script.lags, script.clock, idle, most,
                                   fetching=script)
    return Collector(script.consume, size, 1.0, script.clock, alignment=alignment)


def coordinates(records: Sequence[Any]) -> list[tuple[str, int, int]]:
    return [(r.topic(), r.partition(), r.offset()) for r in records]


def clicks(partition: int, offsets: range, step: int = 100) -> list[RawMessage]:
    return [raw("clicks", partition, o, 1000 + step * o) for o in offsets]


def test_a_topic_with_known_lag_is_waited_for_and_the_rest_held_in_order() -> None:
    """Clicks read before any users record wait while users has records on the broker;
    once users arrive the batch ends at the newest users timestamp, and the clicks past
    it come first in the next batch, in offset order."""
    script = Script([clicks(0, range(6)), [],
                     [raw("users", 0, 0, 900), raw("users", 0, 1, 1250)]])
    script.lag[("users", 0)] = 2
    gathering = collector(script)
    gathering.gather()
    assert gathering.take() == []
    assert gathering.held == 6
    script.lag[("users", 0)] = 0
    gathering.gather()
    assert coordinates(gathering.take()) == [
        ("clicks", 0, 0), ("clicks", 0, 1), ("clicks", 0, 2), ("users", 0, 0), ("users", 0, 1)]
    gathering.gather()
    assert coordinates(gathering.take()) == [
        ("clicks", 0, 3), ("clicks", 0, 4), ("clicks", 0, 5)]
    assert gathering.held == 0


def test_an_unknown_lag_holds_like_a_known_one() -> None:
    """An input whose end offset the client has not learned yet (no fetch answered)
    holds its partition number back, as one with records waiting."""
    script = Script([clicks(0, range(2))])
    script.lag[("users", 0)] = None
    gathering = collector(script)
    gathering.gather()
    assert gathering.take() == []
    assert gathering.held == 2


def test_a_caught_up_topic_does_not_hold_and_other_partitions_are_not_held() -> None:
    """users[1] has nothing left on the broker: partition 1's clicks go at once, while
    partition 0's wait for users[0]'s known lag."""
    script = Script([clicks(0, range(2)) + clicks(1, range(3))])
    script.lag[("users", 0)] = 4
    gathering = collector(script)
    gathering.gather()
    assert coordinates(gathering.take()) == [("clicks", 1, 0), ("clicks", 1, 1), ("clicks", 1, 2)]
    assert coordinates(gathering.records) == [("clicks", 0, 0), ("clicks", 0, 1)]


def test_a_slow_first_fetch_never_lets_later_records_pass_it() -> None:
    """The stream-table join's start on a loaded machine: users[1] (the table) is read
    whole, clicks[1]'s first fetch has not answered (lag not known) for longer than the
    slow-fetch warning. No users record is released before clicks[1] is read: then the
    batch ends at the newest click, and the users stamped after it wait for the next.
    The long wait is logged once, as a warning."""
    users = [raw("users", 1, o, 1000 + 250 * o) for o in range(8)]  # 1000 .. 2750
    script = Script([users])
    script.lag[("clicks", 1)] = None
    gathering = collector(script)
    with capture_logs() as logs:
        for _ in range(int(3 * SLOW_FETCH)):  # batch_wait 1.0 each
            gathering.gather()
            assert gathering.take() == []
    assert gathering.held == 8
    assert [(e["event"], e["log_level"], e["topic"], e["partition"]) for e in logs] == [
        ("kasper.alignment_waiting", "warning", "clicks", 1)]
    script.calls.append(clicks(1, range(5), step=200))  # 1000 .. 1800
    script.lag[("clicks", 1)] = 0
    gathering.gather()
    assert coordinates(gathering.take()) == [
        *[("users", 1, o) for o in range(4)], *[("clicks", 1, o) for o in range(5)]]
    assert coordinates(gathering.records) == [("users", 1, o) for o in range(4, 8)]


def test_a_lag_the_lags_leave_out_is_not_known_so_it_holds() -> None:
    """A lags answer without a topic-partition is no answer: not known to be caught up,
    so its partition number is held, never released as if it had no records."""
    script = Script([clicks(0, range(2))])
    alignment = TimestampAlignment(["users", "clicks"], lambda keys: {}, script.clock, 0.0,
                                   1000)
    gathering = Collector(script.consume, 100, 1.0, script.clock, alignment=alignment)
    gathering.gather()
    assert gathering.take() == []
    assert gathering.held == 2


def test_a_stuck_fetch_holds_its_partition_number_and_the_others_go_on() -> None:
    """users[0] has records on the broker that never come: partition 0 is held however
    long (nothing committed past them), while partition 1, whose users are caught up,
    goes on."""
    script = Script([clicks(0, range(2)) + clicks(1, range(2))])
    script.lag[("users", 0)] = 3
    gathering = collector(script)
    gathering.gather()
    assert coordinates(gathering.take()) == [("clicks", 1, 0), ("clicks", 1, 1)]
    for _ in range(60):
        gathering.gather()
        assert gathering.take() == []
    assert coordinates(gathering.records) == [("clicks", 0, 0), ("clicks", 0, 1)]


def test_max_task_idle_holds_for_a_caught_up_topic_that_long() -> None:
    """With max_task_idle=2.5 a caught-up users partition holds partition 0 for 2.5 s
    (more may arrive), then the clicks go."""
    script = Script([clicks(0, range(2))])
    gathering = collector(script, idle=2.5)
    gathering.gather()
    assert gathering.take() == []
    while not (batch := (gathering.gather(), gathering.take())[1]):
        pass
    assert coordinates(batch) == [("clicks", 0, 0), ("clicks", 0, 1)]
    # held first at 1.0 (batch_wait), then batches of 1.0: the first 2.5 s after that
    assert script.now == pytest.approx(4.0)


def test_the_end_of_a_max_task_idle_wait_is_logged_and_new_records_hold_again() -> None:
    """When max_task_idle runs out for a caught-up users partition the clicks go, and
    the log says so (Kafka Streams' enforced processing); once users[0] has records on
    the broker again, partition 0 waits for them again."""
    script = Script([clicks(0, range(2))])
    gathering = collector(script, idle=1.5)
    with capture_logs() as logs:
        while not (batch := (gathering.gather(), gathering.take())[1]):
            pass
    assert coordinates(batch) == [("clicks", 0, 0), ("clicks", 0, 1)]
    assert [(e["event"], e["log_level"], e["topic"], e["partition"], e["max_task_idle"])
            for e in logs] == [("kasper.alignment_enforced", "info", "users", 0, 1.5)]
    script.lag[("users", 0)] = 1
    script.calls.append(clicks(0, range(2, 3)))
    gathering.gather()
    assert gathering.take() == []
    assert gathering.held == 1


def test_a_batch_of_held_records_still_consumes_up_to_its_size() -> None:
    """Held records do not count toward the next gather: with size 3 and 5 clicks held,
    it consumes until 3 new records are in. The batch then takes 3, the earliest by
    timestamp (the users records before the clicks after them), each partition's a run
    of offsets; the rest wait for the next batch, in order."""
    script = Script([clicks(0, range(5)), [raw("users", 0, 0, 950)],
                     [raw("users", 0, 1, 960)], [raw("users", 0, 2, 2000)]])
    script.lag[("users", 0)] = 3
    gathering = collector(script, size=3)
    assert gathering.gather() and gathering.take() == []
    assert gathering.gather()
    assert script.calls == []
    released = gathering.take()
    assert coordinates(released) == [("clicks", 0, 0), ("users", 0, 0), ("users", 0, 1)]
    assert coordinates(gathering.records) == [("clicks", 0, 1), ("clicks", 0, 2),
                                              ("clicks", 0, 3), ("clicks", 0, 4),
                                              ("users", 0, 2)]


def test_a_topic_partition_with_a_batch_of_records_held_is_not_fetched_until_released() -> None:
    """Memory stays bounded without releasing anything early: once clicks[0] has
    ``most`` records held (users[0] still on the broker), the consumer fetches no more
    of it, nor releases one; users[0] arriving releases them, and clicks[0] is fetched
    again. Nothing released passes the newest users timestamp."""
    script = Script([clicks(0, range(3)), [], clicks(1, range(2))])
    script.lag[("users", 0)] = 1
    gathering = collector(script, most=3)
    gathering.gather()
    assert gathering.take() == []
    assert script.held_back == {("clicks", 0)}
    gathering.gather()
    assert coordinates(gathering.take()) == [("clicks", 1, 0), ("clicks", 1, 1)]
    assert script.held_back == {("clicks", 0)}
    script.calls.append([raw("users", 0, 0, 1150)])
    script.lag[("users", 0)] = 0
    gathering.gather()
    assert coordinates(gathering.take()) == [("clicks", 0, 0), ("clicks", 0, 1), ("users", 0, 0)]
    assert script.held_back == set()
    assert coordinates(gathering.records) == [("clicks", 0, 2)]


def test_revoked_partitions_are_fetched_again_and_forgotten() -> None:
    """A partition revoked while held back is read on (its next owner, or this loop
    again, must be able to fetch it) and forgotten."""
    script = Script([clicks(0, range(3))])
    script.lag[("users", 0)] = 1
    gathering = collector(script, most=3)
    gathering.gather()
    assert gathering.take() == []
    assert script.held_back == {("clicks", 0)}
    gathering.drop({("clicks", 0), ("users", 0)})
    assert script.held_back == set()
    assert gathering.records == []


def test_revoked_partitions_lose_their_held_records() -> None:
    """Dropping a revoked partition forgets its held records; the others stay held, in
    order, and still count as held."""
    script = Script([clicks(0, range(2)) + clicks(1, range(2))])
    script.lag[("users", 0)] = script.lag[("users", 1)] = 1
    gathering = collector(script)
    gathering.gather()
    assert gathering.take() == []
    gathering.drop({("clicks", 1)})
    assert coordinates(gathering.records) == [("clicks", 0, 0), ("clicks", 0, 1)]
    assert gathering.held == 2


def test_max_task_idle_is_checked() -> None:
    """A negative or infinite max_task_idle is refused, naming the field."""
    for bad in (-1, float("inf"), True):
        with pytest.raises(ConfigError, match="max_task_idle"):
            Config(name="a", bootstrap_servers="x", input_topics=["t"], max_task_idle=bad)


def test_max_task_idle_from_the_environment_and_through_the_cli() -> None:
    """KASPER_MAX_TASK_IDLE is read as seconds, 'none' turns alignment off, and a bad
    value stops `kasper run` with the config exit code and a line naming the field."""
    env = {"KASPER_NAME": "a", "KASPER_BOOTSTRAP_SERVERS": "x", "KASPER_INPUT_TOPICS": "t,u"}
    assert load_config(None, {**env, "KASPER_MAX_TASK_IDLE": "2.5"}).max_task_idle == 2.5
    assert load_config(None, {**env, "KASPER_MAX_TASK_IDLE": "none"}).max_task_idle is None
    assert load_config(None, env).max_task_idle == 0.0
    result = kasper("run", "mod:factory", "--name", "p", "--bootstrap-servers", "127.0.0.1:1",
                    "--input-topics", "t,u", env={"KASPER_MAX_TASK_IDLE": "-1"})
    assert result.returncode == EXIT_CONFIG
    assert result.stderr.strip().endswith(
        "config field 'max_task_idle': must be a finite number of seconds >= 0 or None (no "
        "alignment), got -1.0 (from environment)")
    assert "Traceback" not in result.stderr


# -- the loop on the in-memory broker --------------------------------------------------

PARTITIONS = 2
USERS = [(0, "v0"), (200, "v1"), (400, "v2"), (600, "v3"), (800, "v4")]
"""(timestamp, profile) of the one user of each partition."""
CLICK_TIMES = [50 + 100 * j for j in range(10)]


class Enrich(MessageProcessor):
    """Each click with the profile current at its timestamp: the batch's messages in
    timestamp order, users before clicks at equal timestamps."""

    profile: str | None = None

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in sorted(messages, key=lambda m: (m.timestamp, m.topic != "users")):
            if message.topic == "users":
                self.profile = message.value
            else:
                sender.send("enriched", f"{message.value}:{self.profile}",
                            partition=message.partition)


class UsersLate:
    """The in-memory consumer, with the users partitions not fetched for the first
    ``late`` consumes (a slow fetch): their records are on the broker all along."""

    def __init__(self, consumer: Any, late: int) -> None:
        self._consumer, self._late = consumer, late

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def consume(self, max_count: int, timeout: float) -> list[Any]:
        users = {("users", p) for p in range(PARTITIONS)}
        if self._late > 0:
            self._late -= 1
            self._consumer.paused |= users
        else:
            self._consumer.paused -= users
        return self._consumer.consume(max_count, timeout)


def enrich_run(max_task_idle: float | None, batch_size: int | None = None) -> InMemoryBroker:
    broker = InMemoryBroker()
    for topic in ("users", "clicks", "enriched"):
        broker.create_topic(topic, PARTITIONS)
    for p in range(PARTITIONS):
        for ts, profile in USERS:
            broker.produce("users", profile, key="u", partition=p, timestamp=ts)
        for j, ts in enumerate(CLICK_TIMES):
            broker.produce("clicks", f"c{j}", key="u", partition=p, timestamp=ts)
    config = Config(name="enrich", bootstrap_servers="in-memory",
                    input_topics=["users", "clicks"], value_serde="str",
                    max_task_idle=max_task_idle, batch_size=batch_size)
    clients = broker.clients(config)
    clients.consumer = UsersLate(clients.consumer, late=6)
    processor = TopicProcessor(config, Enrich, clients=clients)
    processor.run_loop(until_caught_up=True)
    processor.close()
    return broker


def expected_enriched() -> list[str]:
    return [f"c{j}:v{ts // 200}" for j, ts in enumerate(CLICK_TIMES)]


def test_every_click_sees_the_profile_current_at_its_timestamp() -> None:
    """Clicks fetched before any users record are held until users catch up to them:
    every click gets the profile current at its timestamp, in both partitions, and every
    offset ends committed."""
    broker = enrich_run(max_task_idle=0.0)
    for p in range(PARTITIONS):
        assert [m.value.decode() for m in broker.read("enriched", p)] == expected_enriched()
    committed = broker.committed("enrich")
    assert {tp: committed[tp] for tp in sorted(committed)} == {
        ("clicks", 0): 10, ("clicks", 1): 10, ("users", 0): 5, ("users", 1): 5}


def test_clicks_read_a_batch_ahead_of_the_users_are_held_back_not_released() -> None:
    """Batches of 4: the clicks read while users is not fetched fill a batch's worth of
    held records, so clicks stop being fetched (no record released early, none lost);
    every click still gets the profile of its time, and every offset ends committed."""
    broker = enrich_run(max_task_idle=0.0, batch_size=4)
    for p in range(PARTITIONS):
        assert [m.value.decode() for m in broker.read("enriched", p)] == expected_enriched()
    committed = broker.committed("enrich")
    assert {tp: committed[tp] for tp in sorted(committed)} == {
        ("clicks", 0): 10, ("clicks", 1): 10, ("users", 0): 5, ("users", 1): 5}


def test_no_commit_passes_a_click_newer_than_the_users_read() -> None:
    """After every commit, the clicks committed are no newer than the first users record
    not yet committed: a held click is never committed before the profiles it needs."""
    broker = enrich_run(max_task_idle=0.0)
    committed: dict[TopicPartitionKey, int] = {}
    calls: dict[str | None, list[Commit]] = {}  # one commit call: one note
    for commit in broker.commits("enrich"):
        calls.setdefault(commit.metadata, []).append(commit)
    assert len(calls) == 3  # two turns with input, and the one at close
    for call in calls.values():
        committed.update({(c.topic, c.partition): c.offset for c in call})
        for p in range(PARTITIONS):
            users_next = committed.get(("users", p), 0)
            if users_next < len(USERS):
                newest_allowed = USERS[users_next][0]
                clicks_next = committed.get(("clicks", p), 0)
                assert all(ts < newest_allowed for ts in CLICK_TIMES[:clicks_next])


def test_without_alignment_the_early_clicks_miss_their_profiles() -> None:
    """max_task_idle=None turns alignment off: a batch is what was read, so the clicks
    read before the users get no profile (the race alignment closes)."""
    broker = enrich_run(max_task_idle=None)
    enriched = [m.value.decode() for m in broker.read("enriched", 0)]
    assert enriched != expected_enriched()
    assert enriched[0] == "c0:None"


def test_one_input_topic_is_not_aligned() -> None:
    """One input topic (or only an app's own repartitions besides it) gathers with no
    alignment object at all: the single-input path does no extra work."""
    broker = InMemoryBroker()
    broker.create_topic("clicks", 1)
    broker.create_topic("by-user", 1)
    one = Config(name="a", bootstrap_servers="in-memory", input_topics=["clicks"])
    two = Config(name="a", bootstrap_servers="in-memory", input_topics=["clicks", "by-user"])
    off = Config(name="a", bootstrap_servers="in-memory", input_topics=["clicks", "by-user"],
                 max_task_idle=None)
    assert Prefetcher(one, broker.clients(one))._collector._alignment is UNALIGNED
    assert Prefetcher(two, broker.clients(two), ["by-user"])._collector._alignment is UNALIGNED
    assert Prefetcher(off, broker.clients(off))._collector._alignment is UNALIGNED
    aligned = Prefetcher(two, broker.clients(two))._collector._alignment
    assert isinstance(aligned, TimestampAlignment)


def test_a_batch_with_held_records_carried_in_never_passes_its_size() -> None:
    """Records held by the frontier come first in the next batch; with new ones they
    may outnumber ``size``: the batch takes ``size`` in gathered order, and the rest
    follow in the next one, every partition's offsets contiguous and in order."""

    class Record:
        def __init__(self, topic: str, offset: int) -> None:
            self._topic, self._offset = topic, offset

        def topic(self) -> str:
            return self._topic

        def partition(self) -> int:
            return 0

        def offset(self) -> int:
            return self._offset

        def timestamp(self) -> tuple[int, int]:
            return (1, self._offset)

        def error(self) -> None:
            return None

    class HoldFirstTime:
        """Holds every record of topic ``b`` in the first cut, none after."""

        def __init__(self) -> None:
            self.cuts = 0

        def cut(self, records: list[Any]) -> tuple[list[Any], list[Any]]:
            self.cuts += 1
            if self.cuts > 1:
                return records, []
            return ([r for r in records if r.topic() == "a"],
                    [r for r in records if r.topic() == "b"])

        def forget(self, keys: Any) -> None:
            pass

    arrivals = [[Record("a", n) for n in range(5)] + [Record("b", n) for n in range(5)],
                [Record("a", n) for n in range(5, 10)], [], []]
    collector = Collector(lambda count, wait: arrivals.pop(0)[:count] if arrivals else [],
                          10, 0.05, alignment=HoldFirstTime())
    collector.gather()
    first = collector.take()
    assert [(r.topic(), r.offset()) for r in first] == [("a", n) for n in range(5)]
    collector.size = 6
    collector.gather()
    second = collector.take()
    assert len(second) == 6
    assert [(r.topic(), r.offset()) for r in second] == [("b", n) for n in range(5)] + [("a", 5)]
    third = collector.take()
    assert [(r.topic(), r.offset()) for r in third] == [("a", n) for n in range(6, 10)]
