"""A DSL stateless chain (``filter → map_values → to``, made in one pass) through ``kasper
run`` on the real broker: a function that raises on one record stops the run with the
operator and the record's offset named and nothing past the last good batch committed;
rerun with the dead-letter policy, every other record comes out once, in order; and
each kept record keeps its own headers and timestamp and its key's partition."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.kafka_clients import Producer

sys.path.insert(0, str(Path(__file__).parent))
from test_cli import kasper_command  # isort: skip
from test_dsl_examples import run_env  # isort: skip

pytestmark = pytest.mark.integration

APP = """from kasper_py.dsl import Builder


def checked(value):
    if value == b"poison":
        raise ValueError("poisoned value")
    return value.upper()


b = Builder({name!r})
b.stream({source!r}).filter(lambda k, v: v != b"skip").map_values(checked, name="checked").to(
    {sink!r})
app = b.build()
"""
VALUES = [b"poison" if i == 12 else b"skip" if i % 4 == 3 else b"v%d" % i for i in range(20)]


def test_a_raising_step_stops_the_run_uncommitted_then_dead_letters(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str],
        kafka: Any, tmp_path: Path) -> None:
    """Twenty records, the thirteenth poisoned, batches of at most 5: the run fails naming
    ``checked`` and offset 12; the committed offset is below 13 and the outputs are
    exactly the kept records before it. With ``on_process_error=dead_letter`` the rerun
    ends caught up: every kept record but the poisoned one out once, in order, the
    poisoned one in the dead-letter topic with its offset, all 20 committed."""
    source, sink, dead = new_topic("chain-in"), new_topic("chain-out"), new_topic("chain-dlq")
    name = unique_name("chain")
    (tmp_path / "dsl_app.py").write_text(APP.format(name=name, source=source, sink=sink))
    kafka.produce(source, [(b"k%d" % i, value) for i, value in enumerate(VALUES)], partition=0)
    command = [*kasper_command(), "run", "dsl_app:app", "--app-dir", str(tmp_path),
               "--until-caught-up"]

    failed = subprocess.run(command, env=run_env(bootstrap, tmp_path / "state",
                                                 batch_size="5"),
                            capture_output=True, text=True, timeout=120, check=False)
    assert failed.returncode != 0
    assert "in operator checked, on the record of topic" in failed.stderr
    assert f"{source!r} partition 0 offset 12" in failed.stderr
    committed = kafka.committed(name, source)[0] or 0
    assert committed <= 12
    kept = [(b"k%d" % i, value.upper()) for i, value in enumerate(VALUES)
            if value not in (b"skip", b"poison")]
    assert [(m.key(), m.value()) for m in kafka.read_all(sink)] == [
        (key, value) for key, value in kept if int(key[1:]) < committed]

    done = subprocess.run(command, env=run_env(
        bootstrap, tmp_path / "state", batch_size="5", on_process_error="dead_letter",
        dead_letter_topic=dead), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [(m.key(), m.value()) for m in kafka.read_all(sink)] == kept
    (letter,) = kafka.read_all(dead)
    assert letter.value() == b"poison"
    assert dict(letter.headers())["kasper.source.offset"] == b"12"
    assert kafka.committed(name, source) == {0: 20}


HEADERS_APP = """from kasper_py.dsl import Builder

b = Builder({name!r})
b.stream({source!r}).filter(lambda k, v: v != b"v5").map_values(bytes.upper).to({sink!r})
app = b.build()
"""


def test_a_chain_keeps_each_records_headers_timestamp_and_key_partition(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str],
        kafka: Any, tmp_path: Path) -> None:
    """Twelve keyed records over two partitions, every other one with headers (one a
    ``None`` value), through ``filter → map_values → to`` by ``kasper run``: each kept
    record out once with its key, mapped value, own timestamp and own headers (none
    when it had none), on the partition its key hashes to (murmur2, the input's), in
    its partition's order; every input offset committed."""
    source, sink = new_topic("chain-h-in", partitions=2), new_topic("chain-h-out", partitions=2)
    name = unique_name("chain-h")
    (tmp_path / "dsl_app.py").write_text(HEADERS_APP.format(name=name, source=source, sink=sink))
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random",
                         "enable.idempotence": True})
    headers = {i: [("n", b"%d" % i), ("empty", None)] for i in range(0, 12, 2)}
    for i in range(12):
        producer.produce(source, b"v%d" % i, b"k%d" % i, timestamp=1_700_000_000_000 + i,
                         headers=headers.get(i))
    assert producer.flush(60) == 0
    by_key = {m.key(): m.partition() for m in kafka.read_all(source)}

    done = subprocess.run([*kasper_command(), "run", "dsl_app:app", "--app-dir",
                           str(tmp_path), "--until-caught-up"],
                          env=run_env(bootstrap, tmp_path / "state", batch_size="4"),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = [(m.partition(), m.key(), m.value(), m.timestamp()[1], m.headers())
           for m in kafka.read_all(sink)]
    assert sorted(out) == sorted(
        (by_key[b"k%d" % i], b"k%d" % i, b"V%d" % i, 1_700_000_000_000 + i, headers.get(i))
        for i in range(12) if i != 5)
    for partition in (0, 1):
        stamps = [stamp for p, _, _, stamp, _ in out if p == partition]
        assert stamps == sorted(stamps)
    assert kafka.committed(name, source, partitions=2) == {
        p: Counter(by_key.values()).get(p) for p in (0, 1)}
