"""`kasper topics`, `kasper produce` and `kasper consume` as a user runs them: a
subprocess against the stack's Kafka (and schema registry), a fresh topic per test,
exact outputs, errors and exit codes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.kafka_clients import AdminClient, Producer

sys.path.insert(0, str(Path(__file__).parent))
from test_cli import cli_env, kasper, kasper_command  # isort: skip

from kasper_py.kafka.partitioner import murmur2_partition
from kasper_py.stack import schema_registry_url

pytestmark = pytest.mark.integration

ORDER = json.dumps({"type": "record", "name": "Order", "namespace": "kasper.tests",
                    "fields": [{"name": "id", "type": "string"},
                               {"name": "amount", "type": "long"}]})


def run(*args: str, env: dict[str, str], stdin: str | None = None
        ) -> subprocess.CompletedProcess[str]:
    """One command to completion, ``stdin`` piped in (never a terminal)."""
    return subprocess.run([*kasper_command(), *args], capture_output=True, text=True,
                          env=env, input=stdin or "", timeout=90, check=False)


def node_id(bootstrap: str) -> int:
    """The id of the stack's one broker."""
    return int(next(iter(AdminClient({"bootstrap.servers": bootstrap}).list_topics(
        timeout=10).brokers)))


def test_topics_create_list_describe_delete(bootstrap: str, unique_name: Callable[[str], str],
                                            kafka: Any) -> None:
    """A topic created with partitions and a setting is listed with its count, described
    with its leaders, watermarks and setting, and deleted only with --yes."""
    env, topic = cli_env(bootstrap), unique_name("tcli-made")
    made = run("topics", "create", topic, "--partitions", "3", "--config",
               "retention.ms=600000", env=env)
    assert (made.returncode, made.stdout, made.stderr) == (
        0, f"{topic}: created, 3 partitions\n", "")
    again = run("topics", "create", topic, env=env)
    assert (again.returncode, again.stdout) == (1, "")
    assert again.stderr == (f"kasper topics: error: topic {topic!r} already exists on "
                            f"{bootstrap} (--if-not-exists to accept it)\n")
    accepted = run("topics", "create", topic, "--if-not-exists", env=env)
    assert (accepted.returncode, accepted.stdout) == (0, f"{topic}: exists already, 3 partitions\n")

    listed = run("topics", "list", env=env)
    assert listed.returncode == 0
    assert [topic, "3"] in [line.split() for line in listed.stdout.splitlines()]
    assert not any(line.startswith("__") for line in listed.stdout.splitlines())
    assert "__consumer_offsets" in run("topics", "list", "--all", env=env).stdout

    kafka.produce(topic, [b"a", b"b"], partition=1)
    node = node_id(bootstrap)
    described = run("topics", "describe", topic, env=env)
    assert (described.returncode, described.stderr) == (0, "")
    assert described.stdout.splitlines() == [
        f"topic {topic}: 3 partitions, replication factor 1",
        "settings: retention.ms=600000",
        "partition  leader  replicas  in-sync  low  high",
        f"0          {node}       {node}         {node}        0    0",
        f"1          {node}       {node}         {node}        0    2",
        f"2          {node}       {node}         {node}        0    0"]

    refused = run("topics", "delete", topic, env=env)
    assert (refused.returncode, refused.stderr) == (
        5, f"kasper topics: error: not deleting {topic!r}: confirm with --yes\n")
    deleted = run("topics", "delete", topic, "--yes", env=env)
    assert (deleted.returncode, deleted.stdout) == (0, f"{topic}: deleted\n")
    gone = run("topics", "delete", topic, "--yes", env=env)
    assert (gone.returncode, gone.stderr) == (
        1, f"kasper topics: error: topic {topic!r} does not exist on {bootstrap} "
           "(--if-exists to accept that)\n")
    tolerated = run("topics", "delete", topic, "--yes", "--if-exists", env=env)
    assert (tolerated.returncode, tolerated.stdout) == (0, f"{topic}: does not exist\n")


def test_topics_bad_input(bootstrap: str, unique_name: Callable[[str], str]) -> None:
    """An unknown setting, an impossible replication factor, a partition count under 1,
    a missing topic and an unreachable broker: one line naming the topic and the cause,
    no traceback, the exit code of the cause."""
    env, topic = cli_env(bootstrap), unique_name("tcli-bad")
    unknown = run("topics", "create", topic, "--config", "retention.mss=1", env=env)
    assert unknown.returncode == 1
    assert unknown.stderr.startswith(f"kasper topics: error: cannot create topic {topic!r}: "
                                     "Unknown topic config name: retention.mss")
    replicas = run("topics", "create", topic, "--replication-factor", "3", env=env)
    assert replicas.returncode == 1
    assert replicas.stderr.startswith(
        f"kasper topics: error: cannot create topic {topic!r}: Unable to replicate the "
        "partition 3 time(s)")
    zero = run("topics", "create", topic, "--partitions", "0", env=env)
    assert (zero.returncode, zero.stderr) == (
        2, "kasper topics: error: --partitions must be at least 1, got 0\n")
    setting = run("topics", "create", topic, "--config", "retention.ms", env=env)
    assert (setting.returncode, setting.stderr) == (
        2, "kasper topics: error: --config takes KEY=VALUE, got 'retention.ms'\n")
    missing = run("topics", "describe", topic, env=env)
    assert (missing.returncode, missing.stderr) == (
        1, f"kasper topics: error: topic {topic!r} does not exist on {bootstrap}\n")
    plain = run("topics", "create", topic, env=env)  # the broker's num.partitions: 1
    assert (plain.returncode, plain.stdout) == (0, f"{topic}: created, 1 partition\n")
    assert run("topics", "describe", topic, env=env).stdout.splitlines()[:2] == [
        f"topic {topic}: 1 partition, replication factor 1", "settings: the broker's defaults"]
    assert run("topics", "delete", topic, "--yes", env=env).returncode == 0
    unreachable = run("topics", "list", "-b", "127.0.0.1:1", "--timeout", "1", env=env)
    assert unreachable.returncode == 4
    assert unreachable.stderr.startswith("kasper topics: error: reading metadata on "
                                         "127.0.0.1:1 failed within 1s: ")
    assert "Traceback" not in unknown.stderr + replicas.stderr + unreachable.stderr


def test_produce_consume_round_trip(bootstrap: str, new_topic: Callable[..., str]) -> None:
    """KEY:VALUE lines are written to murmur2(key)'s partition, every one acknowledged,
    and read back decoded, as KEY<TAB>VALUE lines and JSON lines."""
    env, topic = cli_env(bootstrap), new_topic("tcli-rt", partitions=3)
    lines = "alice:1\nbob:2\n\ncarol:3\nalice:4\n"
    produced = run("produce", topic, "--key-separator", ":", env=env, stdin=lines)
    assert (produced.returncode, produced.stdout, produced.stderr) == (
        0, f"4 records written to {topic}\n", "")
    keyed = run("consume", topic, "--keys", env=env)
    assert keyed.returncode == 0
    assert sorted(keyed.stdout.splitlines()) == ["alice\t1", "alice\t4", "bob\t2", "carol\t3"]
    records = [json.loads(line) for line in run("consume", topic, "--json", env=env)
               .stdout.splitlines()]
    assert sorted((r["key"], r["value"], r["partition"]) for r in records) == [
        (key, value, murmur2_partition(key.encode(), 3)) for key, value in
        [("alice", "1"), ("alice", "4"), ("bob", "2"), ("carol", "3")]]
    alice = [r for r in records if r["key"] == "alice"]
    assert [r["value"] for r in alice] == ["1", "4"]  # one partition, in offset order
    assert alice[0]["offset"] < alice[1]["offset"]
    assert all(r["topic"] == topic and r["headers"] == [] and isinstance(r["timestamp"], int)
               for r in records)
    one = run("consume", topic, "--max", "1", "--partition", str(alice[0]["partition"]),
              env=env)
    assert (one.returncode, one.stdout) == (0, "1\n")


def test_produce_json_lines_with_headers(bootstrap: str, new_topic: Callable[..., str],
                                         tmp_path: Path) -> None:
    """--json lines from a file carry keys, JSON values and headers to one partition."""
    env, topic = cli_env(bootstrap), new_topic("tcli-json", partitions=2)
    path = tmp_path / "records.jsonl"
    path.write_text('{"key": "k1", "value": {"n": 1}, "headers": {"source": "cli"}}\n'
                    '{"value": [1, 2], "headers": [["h", "a"], ["h", "b"]]}\n')
    produced = run("produce", topic, "--json", "--value-serde", "json", "--file", str(path),
                   "--partition", "1", env=env)
    assert (produced.returncode, produced.stdout) == (0, f"2 records written to {topic}\n")
    read = run("consume", topic, "--json", "--value-serde", "json", env=env)
    records = [json.loads(line) for line in read.stdout.splitlines()]
    for record in records:
        assert isinstance(record.pop("timestamp"), int)
    assert records == [
        {"topic": topic, "partition": 1, "offset": 0, "key": "k1", "value": {"n": 1},
         "headers": [["source", "cli"]]},
        {"topic": topic, "partition": 1, "offset": 1, "key": None, "value": [1, 2],
         "headers": [["h", "a"], ["h", "b"]]}]


def test_produce_refuses_bad_lines(bootstrap: str, new_topic: Callable[..., str],
                                   unique_name: Callable[[str], str]) -> None:
    """A line its serde cannot encode stops the command naming the line; the records
    before it are written, and said so. A missing topic or partition is refused."""
    env, topic = cli_env(bootstrap), new_topic("tcli-badline")
    not_json = run("produce", topic, "--value-serde", "json", env=env,
                   stdin='{"a": 1}\nplain text\n3\n')
    assert (not_json.returncode, not_json.stdout) == (1, "")
    assert not_json.stderr == (
        "kasper produce: error: line 2: the value is not JSON, as the json serde takes it "
        "here (Expecting value: line 1 column 1 (char 0)): 'plain text'; 1 record written "
        f"to {topic}\n")
    mismatch = run("produce", topic, "--json", env=env, stdin='{"value": {"a": 1}}\n')
    assert (mismatch.returncode, mismatch.stderr) == (
        1, "kasper produce: error: line 1: str serde cannot encode dict; pass str; "
           f"0 records written to {topic}\n")
    unkeyed = run("produce", topic, "-k", ":", env=env, stdin="a:1\nno key here\n")
    assert (unkeyed.returncode, unkeyed.stderr) == (
        1, "kasper produce: error: line 2: no key separator ':' in 'no key here'; "
           f"1 record written to {topic}\n")
    assert run("consume", topic, "--keys", env=env).stdout == '\t{"a":1}\na\t1\n'
    partition = run("produce", topic, "--partition", "4", env=env, stdin="x\n")
    assert (partition.returncode, partition.stderr) == (
        2, f"kasper produce: error: --partition 4: topic {topic!r} has partitions 0..0\n")
    missing = unique_name("tcli-none")
    absent = run("produce", missing, env=env, stdin="x\n")
    assert (absent.returncode, absent.stderr) == (
        1, f"kasper produce: error: topic {missing!r} does not exist on {bootstrap}\n")


def test_consume_from_offset_time_and_end(bootstrap: str, new_topic: Callable[..., str],
                                          kafka: Any) -> None:
    """--from an offset, an ISO time (offsets_for_times) or the end; --max stops early."""
    env, topic = cli_env(bootstrap), new_topic("tcli-from")
    base = (int(time.time()) - 86_400) // 60 * 60_000  # a day ago, on a whole minute
    kafka.produce(topic, [(None, f"v{i}".encode(), base + i * 60_000) for i in range(5)])
    assert run("consume", topic, "--from", "3", env=env).stdout == "v3\nv4\n"
    moment = datetime.fromtimestamp((base + 90_000) / 1000, UTC).isoformat()
    assert run("consume", topic, "--from", moment, env=env).stdout == "v2\nv3\nv4\n"
    naive = datetime.fromtimestamp((base + 60_000) / 1000, UTC).replace(tzinfo=None)
    assert run("consume", topic, "--from", naive.isoformat(), "--max", "2",
               env=env).stdout == "v1\nv2\n"
    end = run("consume", topic, "--from", "end", env=env)
    assert (end.returncode, end.stdout) == (0, "")
    bad = run("consume", topic, "--from", "yesterday", env=env)
    assert (bad.returncode, bad.stderr) == (
        2, "kasper consume: error: --from takes beginning, end, an offset or an ISO 8601 "
           "time (2026-11-26T09:30:00Z), got 'yesterday'\n")


def test_consume_undecodable_record(bootstrap: str, new_topic: Callable[..., str],
                                    kafka: Any) -> None:
    """A record its serde cannot decode is named on stderr (partition, offset, error):
    the command prints what it read before it and exits 1, or skips it with
    --skip-errors. A serde that does not match the data is the same error."""
    env, topic = cli_env(bootstrap), new_topic("tcli-undecodable")
    kafka.produce(topic, [b"good", b"\xff\xfe", b"after"])
    stopped = run("consume", topic, env=env)
    assert (stopped.returncode, stopped.stdout) == (1, "good\n")
    assert stopped.stderr == (f"kasper consume: error: {topic}[0] offset 1: the value "
                              "cannot be decoded: str serde: invalid UTF-8 at byte 0\n")
    skipped = run("consume", topic, "--skip-errors", env=env)
    assert (skipped.returncode, skipped.stdout) == (0, "good\nafter\n")
    assert skipped.stderr == (
        f"kasper consume: error: {topic}[0] offset 1: the value cannot be decoded: str "
        "serde: invalid UTF-8 at byte 0\nkasper consume: error: 1 undecodable record "
        "skipped\n")
    mismatch = run("consume", topic, "--value-serde", "json", env=env)
    assert (mismatch.returncode, mismatch.stdout) == (1, "")
    assert mismatch.stderr == (
        f"kasper consume: error: {topic}[0] offset 0: the value cannot be decoded: json "
        "serde: invalid JSON: Expecting value: line 1 column 1 (char 0)\n")
    raw = run("consume", topic, "--value-serde", "bytes", env=env)
    assert (raw.returncode, raw.stdout) == (0, "good\n\\xff\\xfe\nafter\n")


def test_consume_read_committed_hides_aborted(bootstrap: str,
                                              new_topic: Callable[..., str]) -> None:
    """Records of an aborted transaction are hidden by default (read_committed) and shown
    with --isolation read_uncommitted; either way the command ends past the markers."""
    env, topic = cli_env(bootstrap), new_topic("tcli-txn")
    producer = Producer({"bootstrap.servers": bootstrap,
                         "transactional.id": f"{topic}-txn"})
    producer.init_transactions(30)
    for values, commit in ((["a", "b"], True), (["aborted"], False), (["c"], True)):
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value.encode(), partition=0)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    committed = run("consume", topic, env=env)
    assert (committed.returncode, committed.stdout) == (0, "a\nb\nc\n")
    everything = run("consume", topic, "--isolation", "read_uncommitted", env=env)
    assert (everything.returncode, everything.stdout) == (0, "a\nb\naborted\nc\n")


def test_follow_prints_new_records_until_interrupted(bootstrap: str,
                                                     new_topic: Callable[..., str]) -> None:
    """--follow goes on past the end until Ctrl-C, which ends it with exit 0."""
    env, topic = cli_env(bootstrap), new_topic("tcli-follow")
    assert run("produce", topic, env=env, stdin="first\n").returncode == 0
    follower = subprocess.Popen([*kasper_command(), "consume", topic, "--follow"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == "first\n"
        assert run("produce", topic, env=env, stdin="second\n").returncode == 0
        assert follower.stdout.readline() == "second\n"
        follower.send_signal(signal.SIGINT)
        assert follower.wait(30) == 0
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait(10)


def test_avro_round_trip_through_the_registry(bootstrap: str, new_topic: Callable[..., str],
                                              tmp_path: Path) -> None:
    """JSON lines written as Avro (schema registered under the topic's subject) read
    back as the same records; without --registry-url avro is a configuration error."""
    env, topic = cli_env(bootstrap), new_topic("tcli-avro")
    schema = tmp_path / "order.avsc"
    schema.write_text(ORDER)
    url = schema_registry_url()
    lines = 'o1|{"id": "o1", "amount": 5}\no2|{"id": "o2", "amount": 7}\n'
    produced = run("produce", topic, "-k", "|", "--value-serde", "avro", "--value-schema",
                   str(schema), "--registry-url", url, env=env, stdin=lines)
    assert (produced.returncode, produced.stdout, produced.stderr) == (
        0, f"2 records written to {topic}\n", "")
    read = run("consume", topic, "--keys", "--value-serde", "avro", "--registry-url", url,
               env=env)
    assert (read.returncode, read.stdout) == (
        0, 'o1\t{"id": "o1", "amount": 5}\no2\t{"id": "o2", "amount": 7}\n')
    wrong = run("produce", topic, "--value-serde", "avro", "--value-schema", str(schema),
                "--registry-url", url, env=env, stdin='{"id": "o3"}\n')
    assert wrong.returncode == 1
    assert wrong.stderr.startswith(f"kasper produce: error: line 1: avro serde cannot "
                                   f"encode (subject '{topic}-value'): ")
    assert wrong.stderr.endswith(f"; 0 records written to {topic}\n")
    no_registry = run("consume", topic, "--value-serde", "avro", env=env)
    assert no_registry.returncode == 3
    assert "needs a schema registry" in no_registry.stderr


def test_help_lists_the_choices(bootstrap: str) -> None:
    """Each command's help names its serdes, positions and isolation levels."""
    env = cli_env(bootstrap, COLUMNS="400")  # no wrapping inside a list
    consume = run("consume", "--help", env=env).stdout
    assert "str, bytes, json, avro, protobuf, json_schema" in consume
    assert "{read_committed,read_uncommitted}" in consume
    assert "murmur2(key)" in run("produce", "--help", env=env).stdout
    top = kasper("--help", env=env).stdout
    assert all(name in top for name in ("topics", "produce", "consume"))


def test_json_schema_round_trip_with_the_config_file(bootstrap: str,
                                                     new_topic: Callable[..., str],
                                                     tmp_path: Path) -> None:
    """The registry and serdes may come from a processor's TOML file: JSON lines
    validated by a JSON Schema are written, and a record the schema refuses names its
    line."""
    env, topic = cli_env(bootstrap), new_topic("tcli-jsonschema")
    schema = tmp_path / "order.json"
    schema.write_text(json.dumps({"type": "object", "title": "Order",
                                  "properties": {"id": {"type": "string"},
                                                 "amount": {"type": "integer"}},
                                  "required": ["id", "amount"]}))
    config = tmp_path / "kasper.toml"
    config.write_text(f'value_serde = "json_schema"\n[registry]\nurl = '
                      f'"{schema_registry_url()}"\nvalue_schema = "{schema}"\n')
    produced = run("produce", topic, "--config", str(config), env=env,
                   stdin='{"id": "o1", "amount": 5}\n{"id": "o2"}\n')
    assert produced.returncode == 1
    assert produced.stderr.startswith("kasper produce: error: line 2: json_schema serde "
                                      f"cannot encode (subject '{topic}-value'): ")
    assert produced.stderr.endswith(f"; 1 record written to {topic}\n")
    read = run("consume", topic, "--config", str(config), "--json", env=env)
    assert read.returncode == 0
    assert [json.loads(line)["value"] for line in read.stdout.splitlines()] == [
        {"id": "o1", "amount": 5}]
