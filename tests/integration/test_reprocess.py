"""Reprocessing with Spark on a real broker and a local[2] session: parity with the live
loop (outputs and store state, a DSL pipeline, the DSL's drop_duplicates), the handoff to
the live group, refusals and bad ranges."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis
import reprocess_processors as procs

from kasper_py import Config, ReprocessError, TopicError, TopicProcessor
from kasper_py.cli.base import load_attr
from kasper_py.reprocess import (
    HandoffRefusedError,
    RangeError,
    main,
    reprocess,
)
from kasper_py.stack import redis_url
from tests.kafka_clients import Consumer, Producer

pytest_plugins = ["conftest_spark"]
pytestmark = [pytest.mark.integration, pytest.mark.spark]

NO_SPARK: Any = object()
"""Passed as the session where the error must come before Spark is used at all."""



def config(bootstrap: str, name: str, topics: list[str], **kwargs: Any) -> Config:
    values: dict[str, Any] = {"batch_size": 500, "batch_wait": 0.2}
    values.update(kwargs)
    return Config(name=name, bootstrap_servers=bootstrap, input_topics=topics, **values)


def run_live(cfg: Config, factory: Callable[..., Any], **kwargs: Any) -> None:
    processor = TopicProcessor(cfg, factory, **kwargs)
    try:
        processor.run_loop(until_caught_up=True)
    finally:
        processor.close()


def outputs(kafka: Any, topic: str) -> Counter[tuple[Any, ...]]:
    return Counter((m.partition(), m.key(), m.value(), tuple(m.headers() or ()))
                   for m in kafka.read_all(topic))


def test_parity_200k_outputs_match_the_live_loop(bootstrap, new_topic, kafka, unique_name,
                                                 spark) -> None:
    """200k messages through the live loop and through reprocessing: same output multiset
    (partition, key, value with its input coordinates and timestamp, headers)."""
    source = new_topic("in", partitions=4)
    live_out, spark_out = new_topic("live", partitions=4), new_topic("spark", partitions=4)
    for p in range(4):
        kafka.produce(source, [(b"k%d" % (i % 997), b"v%d-%d" % (p, i)) for i in range(50_000)],
                      partition=p)
    _produce_with_headers(kafka, source)
    total = 200_000 + 8
    run_live(config(bootstrap, unique_name("live"), [source], batch_size=2000),
             partial(procs.Tagged, output=live_out))
    result = reprocess(config(bootstrap, unique_name("spark"), [source], batch_size=2000),
                       partial(procs.Tagged, output=spark_out), spark=spark)
    assert (result.messages, result.produced) == (total, total)
    assert sorted(p.partition for p in result.partitions) == [0, 1, 2, 3]
    live, replayed = outputs(kafka, live_out), outputs(kafka, spark_out)
    assert sum(live.values()) == total
    assert replayed == live


def _produce_with_headers(kafka: Any, topic: str) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for p in range(4):
        for i in range(2):
            producer.produce(topic, b"with-headers-%d" % i, key=b"h", partition=p,
                             headers=[("trace", b"\x00\xff%d" % i), ("empty", None)])
    assert producer.flush(30) == 0


def test_word_count_reaches_the_same_state_both_ways(bootstrap, new_topic, kafka, unique_name,
                                                     spark) -> None:
    """A stateful word count over two co-partitioned topics leaves the same Redis state
    when run live and when reprocessed, and both equal the counts computed here."""
    topics = [new_topic("lines-a", partitions=2), new_topic("lines-b", partitions=2)]
    vocabulary = [f"w{i}" for i in range(150)]
    rng = random.Random(5)
    expected: Counter[tuple[int, str]] = Counter()
    for topic in topics:
        for p in range(2):
            lines = [" ".join(rng.choices(vocabulary, k=6)) for _ in range(10_000)]
            expected.update((p, w) for line in lines for w in line.split())
            kafka.produce(topic, [line.encode() for line in lines], partition=p)
    live_name, spark_name = unique_name("wc-live"), unique_name("wc-spark")
    for name in (live_name, spark_name):
        cfg = config(bootstrap, name, topics, value_serde="str", batch_size=700)
        if name == live_name:
            run_live(cfg, procs.WordCount, stores=procs.word_count_stores(cfg))
        else:
            reprocess(cfg, procs.WordCount, stores=procs.word_count_stores(cfg),
                      output="stores", spark=spark)
    client = redis.Redis.from_url(redis_url())
    assert _counts(client, live_name) == dict(expected)
    assert _counts(client, spark_name) == dict(expected)


def _counts(client: Any, name: str) -> dict[tuple[int, str], int]:
    counts = {}
    for key in client.scan_iter(match=f"{name}/{procs.STORE}/*", count=1000):
        _, _, partition, word = key.decode().split("/", 3)
        counts[int(partition), word] = json.loads(client.get(key))
    client.delete(*client.keys(f"{name}/*"))
    return counts


def test_handoff_then_live_loop_processes_each_message_once(bootstrap, new_topic, kafka,
                                                             unique_name, spark) -> None:
    """Reprocess up to explicit offsets and hand off; the live loop then resumes exactly
    there: every input message (old and new) is output exactly once across the two."""
    source, output = new_topic("in", partitions=2), new_topic("out", partitions=2)
    for p in range(2):
        kafka.produce(source, [b"old-%d" % i for i in range(3000)], partition=p)
    cfg = config(bootstrap, unique_name("handoff"), [source])
    factory = partial(procs.Tagged, output=output)
    ends = {(source, 0): 1000, (source, 1): 2500}
    result = reprocess(cfg, factory, end=ends, handoff=True, spark=spark)
    assert result.handed_off and result.messages == 3500
    assert kafka.committed(cfg.group, source, 2) == {0: 1000, 1: 2500}
    for p in range(2):
        kafka.produce(source, [b"new-%d" % i for i in range(500)], partition=p)
    run_live(cfg, factory)
    seen = Counter(tuple(m.value().split(b"|")[1:3]) for m in kafka.read_all(output))
    assert sum(seen.values()) == 7000
    assert set(seen.values()) == {1}
    assert set(seen) == {(b"%d" % p, b"%d" % o) for p in range(2) for o in range(3500)}
    assert kafka.committed(cfg.group, source, 2) == {0: 3500, 1: 3500}


def test_handoff_refused_while_the_group_is_active(bootstrap, new_topic, kafka, unique_name,
                                                   spark) -> None:
    """A member in the live group makes reprocess(handoff=True) refuse before any work:
    nothing produced, offsets untouched, and the error names the group and member."""
    source, output = new_topic("in"), new_topic("out")
    kafka.produce(source, [b"m%d" % i for i in range(100)])
    cfg = config(bootstrap, unique_name("active"), [source])
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": cfg.group,
                       "client.id": "live-member", "enable.auto.commit": False})
    member.subscribe([source])
    try:
        deadline = time.monotonic() + 30
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(0.2)
        assert member.assignment(), "the member never joined"
        with pytest.raises(HandoffRefusedError) as info:
            reprocess(cfg, partial(procs.Tagged, output=output), handoff=True, spark=NO_SPARK)
    finally:
        member.close()
    text = str(info.value)
    assert cfg.group in text and "is active" in text and "live-member" in text
    assert "force=True" in text
    assert kafka.committed(cfg.group, source) == {0: None}
    assert kafka.read_all(output) == []


def test_failing_processor_fails_the_job_without_handoff(bootstrap, new_topic, kafka,
                                                          unique_name, spark) -> None:
    """process() raising in a Spark task fails the job with a ReprocessError that names
    the partition, offsets and cause; the live group's offsets are not moved."""
    source, output = new_topic("in"), new_topic("out")
    kafka.produce(source, [b"ok-%d" % i for i in range(20)] + [b"poison"])
    cfg = config(bootstrap, unique_name("fails"), [source], batch_size=8)
    with pytest.raises(ReprocessError) as info:
        reprocess(cfg, partial(procs.Tagged, output=output, fail_on=b"poison"), handoff=True,
                  spark=spark)
    text = str(info.value)
    assert "process() of partition 0 raised ValueError: cannot handle b'poison'" in text
    assert f"{source}[0] offsets 16..20" in text
    assert kafka.committed(cfg.group, source) == {0: None}


def test_async_processor_reprocesses_like_the_live_loop(bootstrap, new_topic, kafka,
                                                       unique_name, spark) -> None:
    """An AsyncMessageProcessor on Spark sends what it sends on the live loop (its
    failures on Spark: test_reprocess_task.py)."""
    source, live_out, spark_out = new_topic("in", partitions=2), new_topic("lo"), new_topic("so")
    kafka.produce(source, [(b"k%d" % (i % 7), b"v%d" % i) for i in range(300)])
    cfg = config(bootstrap, unique_name("async"), [source], batch_size=50)
    run_live(cfg, partial(procs.AsyncTagged, output=live_out))
    reprocess(cfg, partial(procs.AsyncTagged, output=spark_out), spark=spark)
    assert outputs(kafka, spark_out) == outputs(kafka, live_out)
    assert sum(outputs(kafka, spark_out).values()) == 300


def test_a_raising_coroutine_fails_the_spark_job_and_writes_nothing(
        bootstrap, new_topic, kafka, unique_name, spark) -> None:
    """An AsyncMessageProcessor whose coroutine raises on Spark fails the job with a
    ReprocessError naming the partition, offsets and cause; nothing reaches the output
    topic (the failed task's queued output is dropped) and the group's offsets stay."""
    source, output = new_topic("in"), new_topic("out")
    kafka.produce(source, [b"poison"] + [b"ok-%d" % i for i in range(5)])
    cfg = config(bootstrap, unique_name("afail"), [source], batch_size=50)
    with pytest.raises(ReprocessError) as info:
        reprocess(cfg, partial(procs.AsyncTagged, output=output, fail_on=b"poison"),
                  handoff=True, spark=spark)
    text = str(info.value)
    assert "process() of partition 0 raised ValueError: cannot handle b'poison'" in text
    assert f"{source}[0] offsets 0..5" in text
    assert kafka.read_all(output) == []
    assert kafka.committed(cfg.group, source) == {0: None}


def test_arrow_processor_reprocesses_like_the_live_loop(bootstrap, new_topic, kafka,
                                                       unique_name, spark) -> None:
    """An ArrowMessageProcessor on Spark sends what it sends on the live loop."""
    source, live_out, spark_out = new_topic("in", partitions=2), new_topic("lo"), new_topic("so")
    kafka.produce(source, [(b"u%d" % (i % 3), json.dumps({"user": f"u{i % 3}", "amount": i})
                            .encode()) for i in range(300)])
    cfg = config(bootstrap, unique_name("arrow"), [source], batch_size=50, value_serde="json",
                 key_serde="str")
    run_live(cfg, partial(procs.ArrowDoubler, output=live_out))
    reprocess(cfg, partial(procs.ArrowDoubler, output=spark_out), spark=spark)
    assert outputs(kafka, spark_out) == outputs(kafka, live_out)
    assert sum(outputs(kafka, spark_out).values()) == 300


def test_columnar_records_reprocess_like_the_live_loop(bootstrap, new_topic, kafka,
                                                      unique_name, spark) -> None:
    """JSON bytes (``value_serde="bytes"``) reach an ArrowMessageProcessor on Spark as
    columns (parsed by Arrow's JSON reader, as the loop's to_arrow does): the same outputs
    as the live loop, offsets and timestamps included."""
    source, live_out, spark_out = new_topic("in", partitions=2), new_topic("lo"), new_topic("so")
    kafka.produce(source, [(b"u%d" % (i % 3), json.dumps({"user": f"u{i % 3}", "amount": i})
                            .encode()) for i in range(300)])
    cfg = config(bootstrap, unique_name("cols"), [source], batch_size=50, key_serde="str")
    run_live(cfg, partial(procs.ArrowBytesDoubler, output=live_out))
    result = reprocess(cfg, partial(procs.ArrowBytesDoubler, output=spark_out), spark=spark)
    assert outputs(kafka, spark_out) == outputs(kafka, live_out)
    assert sum(outputs(kafka, spark_out).values()) == 300
    assert sorted(json.loads(m.value())["doubled"] for m in kafka.read_all(spark_out)) == [
        2 * i for i in range(300)]
    assert sum(stats.messages for stats in result.partitions) == 300
    assert all(stats.ranges == {source: [0, stats.messages - 1]}
               for stats in result.partitions)


def test_a_raising_process_table_fails_the_spark_job_and_writes_nothing(
        bootstrap, new_topic, kafka, unique_name, spark) -> None:
    """A columnar batch whose process_table raises fails the job with a ReprocessError
    naming the partition, offsets and cause; nothing reaches the output topic and the
    group's offsets stay uncommitted."""
    source, output = new_topic("in"), new_topic("out")
    amounts = [-1, *range(5)]
    kafka.produce(source, [(b"u0", json.dumps({"user": "u0", "amount": a}).encode())
                           for a in amounts])
    cfg = config(bootstrap, unique_name("colfail"), [source], batch_size=50, key_serde="str")
    with pytest.raises(ReprocessError) as info:
        reprocess(cfg, partial(procs.ArrowBytesDoubler, output=output), handoff=True,
                  spark=spark)
    text = str(info.value)
    assert "process() of partition 0 raised ValueError: negative amount" in text
    assert f"{source}[0] offsets 0..5" in text
    assert kafka.read_all(output) == []
    assert kafka.committed(cfg.group, source) == {0: None}


def test_bad_ranges_fail_before_spark_with_clear_errors(bootstrap, new_topic, kafka,
                                                        unique_name) -> None:
    """End before start, offsets outside the watermarks, a partition that is not an
    input, and times in the wrong order: each a RangeError naming the problem; an unknown
    topic is the live loop's TopicError."""
    source = new_topic("in", partitions=2)
    kafka.produce(source, [b"m%d" % i for i in range(100)], partition=0)
    cfg = config(bootstrap, unique_name("bad"), [source])
    factory = partial(procs.Tagged, output="unused")
    cases = [
        ({"start": {(source, 0): 50}, "end": {(source, 0): 10}},
         f"end before start for {source}[0]: end offset 10 < start offset 50"),
        ({"end": {(source, 0): 5000}},
         f"end offset 5000 of {source}[0] is outside its watermarks 0 (earliest) to 100"),
        ({"start": {(source, 7): 0}}, f"{source}[7], which is not an input partition"),
        ({"start": datetime.now(UTC), "end": datetime.now(UTC) - timedelta(hours=1)},
         f"end before start for {source}[0]: end offset 0 < start offset 100"),
    ]
    for kwargs, message in cases:
        with pytest.raises(RangeError) as info:
            reprocess(cfg, factory, spark=NO_SPARK, **kwargs)
        assert message in str(info.value)
    missing = unique_name("no-such-topic")
    with pytest.raises(TopicError, match=f"input topic '{missing}': does not exist"):
        reprocess(config(bootstrap, unique_name("bad"), [missing]), factory, spark=NO_SPARK)
    with pytest.raises(ReprocessError, match="output='stores' needs the stores"):
        reprocess(cfg, factory, output="stores", spark=NO_SPARK)


@pytest.mark.usefixtures("spark")
def test_cli_reprocesses_into_stores_and_hands_off(bootstrap, new_topic, kafka, unique_name,
                                                   capsys) -> None:
    """`python -m kasper_py.reprocess` with --stores, --output stores, explicit --end
    offsets and --handoff: exit 0, a summary line, the state written, the group moved."""
    source = new_topic("lines")
    kafka.produce(source, [b"a b", b"b c", b"c d", b"d e"])
    name = unique_name("cli")
    code = main([f"{procs.__name__}:WordCount", "--app-dir", str(Path(procs.__file__).parent),
                 "--stores", f"{procs.__name__}:word_count_stores", "--output", "stores",
                 "--end", f"{source}:0=3", "--handoff", "--name", name,
                 "--bootstrap-servers", bootstrap, "--input-topics", source,
                 "--log-format", "json"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "reprocessed 3 messages" in out and f"group {name} resumes at {source}[0] 3" in out
    assert kafka.committed(name, source) == {0: 3}
    client = redis.Redis.from_url(redis_url())
    assert _counts(client, name) == {(0, "a"): 1, (0, "b"): 2, (0, "c"): 2, (0, "d"): 1}
    code = main([f"{procs.__name__}:WordCount", "--app-dir", str(Path(procs.__file__).parent),
                 "--end", f"{source}:0=99", "--name", name, "--bootstrap-servers", bootstrap,
                 "--input-topics", source, "--log-format", "json"])
    assert code == 3
    assert f"end offset 99 of {source}[0] is outside its watermarks" in capsys.readouterr().err


def test_a_retried_task_fails_the_job_instead_of_running_a_partition_twice(
        bootstrap, new_topic, kafka, unique_name, tmp_path) -> None:
    """On a session that retries tasks (local[2,2] here, any cluster by default), the
    first attempt fails and Spark retries it: the retry refuses to run the partition
    again, the job fails with a ReprocessError saying so, and nothing is handed off."""
    source, output = new_topic("in"), new_topic("out")
    kafka.produce(source, [b"m%d" % i for i in range(10)])
    group, marker = unique_name("retry"), tmp_path / "attempted"
    worker = Path(__file__).with_name("reprocess_retry_worker.py")
    done = subprocess.run([sys.executable, str(worker), bootstrap, source, output, group,
                           str(marker)], capture_output=True, text=True, timeout=300,
                          check=False, cwd=worker.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    error = json.loads(done.stdout.strip().splitlines()[-1])["error"]
    assert marker.exists()
    assert error is not None and "Spark retried task 0 (attempt 1)" in error
    assert kafka.committed(group, source) == {0: None}


DSL_APP = '''
from kasper_py.dsl import Builder


def pipeline(name, source, output):
    """filter -> map_values -> select_key -> to: one stage, no repartition."""
    builder = Builder(name, stores="memory")
    (builder.stream(source)
        .filter(lambda key, value: int(value) % 3 != 0)
        .map_values(lambda value: value + ":" + str(len(value)))
        .to(output))
    return builder.build()


live = pipeline({live_name!r}, {source!r}, {live_out!r})
app = pipeline({spark_name!r}, {source!r}, {spark_out!r})
'''


def test_a_dsl_pipeline_reprocesses_like_the_live_loop(  # noqa: PLR0917 - fixtures
        bootstrap, new_topic, kafka, unique_name, tmp_path, capsys) -> None:
    """A one-stage streams-DSL app (filter, map_values, to) through `kasper reprocess
    module:app` (the app's name and sources its config) gives the live loop's outputs:
    the same keys, values, partitions and timestamps."""
    source = new_topic("dsl-in", partitions=2)
    live_out, spark_out = new_topic("dsl-live", partitions=2), new_topic("dsl-spark", 2)
    hour_ago = (int(time.time()) - 3600) * 1000  # within the broker's 24 h retention
    for p in range(2):
        kafka.produce(source, [(b"k%d" % (i % 31), b"%d" % i, hour_ago + i)
                               for i in range(p, 3000, 2)], partition=p)
    live_name, spark_name = unique_name("dsl-live"), unique_name("dsl-spark")
    (tmp_path / "dsl_reprocess_app.py").write_text(DSL_APP.format(
        live_name=live_name, spark_name=spark_name, source=source, live_out=live_out,
        spark_out=spark_out))
    (tmp_path / "kasper.toml").write_text('key_serde = "str"\nvalue_serde = "str"\n')
    live_app = load_attr("dsl_reprocess_app:live", str(tmp_path), "target")
    run_live(config(bootstrap, live_name, [source], key_serde="str", value_serde="str"),
             live_app)
    code = main(["dsl_reprocess_app:app", "--app-dir", str(tmp_path), "--config",
                 str(tmp_path / "kasper.toml"), "--bootstrap-servers", bootstrap,
                 "--master", "local[2]", "--log-format", "json"])
    assert code == 0, capsys.readouterr().err[-3000:]
    assert "reprocessed 3000 messages" in capsys.readouterr().out

    def stamped(topic: str) -> Counter[tuple[Any, ...]]:
        return Counter((m.partition(), m.key(), m.value(), m.timestamp()[1])
                       for m in kafka.read_all(topic))

    live = stamped(live_out)
    assert sum(live.values()) == 2000
    assert (0, b"k1", b"1:1", hour_ago + 1) in live or (
        1, b"k1", b"1:1", hour_ago + 1) in live
    assert stamped(spark_out) == live


DEDUP_WITHIN_MS = 20
DEDUP_APP = '''
from kasper_py.dsl import Builder


def dedup(name, source, output):
    """Each key's first record within 20 ms of event time: one stage."""
    builder = Builder(name, stores="memory")
    builder.stream(source).drop_duplicates({within}, "seen").to(output)
    return builder.build()


live = dedup({live_name!r}, {source!r}, {live_out!r})
app = dedup({spark_name!r}, {source!r}, {spark_out!r})
'''


def test_drop_duplicates_reprocesses_like_the_live_loop(  # noqa: PLR0917 - fixtures
        bootstrap: str, new_topic: Any, kafka: Any, unique_name: Any, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], spark: Any) -> None:
    """600 records on 2 partitions, 7 keys, 1 ms apart: a key comes back every 14 ms of
    its input partition, so every other one is a duplicate. The live loop (batches of
    500) and Spark (batches of 37, cut elsewhere) let through exactly the records the
    rule keeps, computed here, timestamps included. ``kasper reprocess`` runs on the
    module's session, which is active (no --master)."""
    source = new_topic("dedup-in", partitions=2)
    live_out, spark_out = new_topic("dedup-live", partitions=2), new_topic("dedup-spark", 2)
    start = (int(time.time()) - 3600) * 1000  # within the broker's 24 h retention
    rows = {p: [(b"k%d" % (i % 7), b"%d" % i, start + i) for i in range(p, 600, 2)]
            for p in range(2)}
    for partition, records in rows.items():
        kafka.produce(source, records, partition=partition)
    live_name, spark_name = unique_name("dedup-live"), unique_name("dedup-spark")
    (tmp_path / "dedup_reprocess_app.py").write_text(DEDUP_APP.format(
        within=DEDUP_WITHIN_MS / 1000, live_name=live_name, spark_name=spark_name, source=source,
        live_out=live_out, spark_out=spark_out))
    (tmp_path / "kasper.toml").write_text('key_serde = "str"\nvalue_serde = "str"\n'
                                          "batch_size = 37\n")
    run_live(config(bootstrap, live_name, [source], key_serde="str", value_serde="str"),
             load_attr("dedup_reprocess_app:live", str(tmp_path), "target"))
    code = main(["dedup_reprocess_app:app", "--app-dir", str(tmp_path), "--config",
                 str(tmp_path / "kasper.toml"), "--bootstrap-servers", bootstrap,
                 "--log-format", "json"])
    assert code == 0, capsys.readouterr().err[-3000:]
    assert "reprocessed 600 messages" in capsys.readouterr().out
    expected = _dedup_kept(rows)
    assert 300 <= sum(expected.values()) < 600  # about half pass: not vacuous
    assert _dedup_stamped(kafka, live_out) == expected
    assert _dedup_stamped(kafka, spark_out) == expected


def _dedup_kept(rows: dict[int, list[tuple[bytes, bytes, int]]]) -> Counter[tuple[Any, ...]]:
    """The rule: a record passes when its key has none held, or its time is at least
    ``DEDUP_WITHIN_MS`` past the one held; a passing record is held."""
    kept: Counter[tuple[Any, ...]] = Counter()
    for records in rows.values():
        held: dict[bytes, int] = {}
        for key, value, at in records:
            if key not in held or at >= held[key] + DEDUP_WITHIN_MS:
                held[key] = at
                kept[key, value, at] += 1
    return kept


def _dedup_stamped(kafka: Any, topic: str) -> Counter[tuple[Any, ...]]:
    """(key, value, timestamp) of each output record; ``to`` partitions by the key."""
    return Counter((m.key(), m.value(), m.timestamp()[1])
                   for m in kafka.read_all(topic))
