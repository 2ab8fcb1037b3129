"""Stateful word count throughput per store against passthrough, round trips per batch,
commit latency, exactly-once against at-least-once, and RocksDB restore speed, all in
the same run on the same broker.

Every loop reads the same input (lines of five words from a 1000-word vocabulary), each
in its own process. Passthrough sends every line on; the word counts add each batch's
counts to a table (one get_many, one put_many per partition per batch) and send every
changed total on. A loop is ``<store>`` (at-least-once), ``<store>-eo`` (an
effectively-once Redis, Cassandra, OpenSearch or PostgreSQL table, at-least-once loop; a PostgreSQL
turn is then one SQL transaction of the rows and the input offsets) or ``<store>-eos``
(processing_guarantee="exactly_once": each turn one Kafka transaction of its outputs,
changelog records and input offsets; passthrough and RocksDB only, the stores whose
writes the transaction holds). Commit latency is each turn's commit step
(``TurnStats.durations["commit"]``; exactly-once: the transaction's commit). Then a
changelog of --restore-records records is restored into an empty RocksDB folder. A
benchmark, not a test: targets are printed, never asserted.

    python bench/bench_stores.py --messages 200000 --partitions 2
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from typing import Any

import psycopg
import redis
import structlog
from benchkit import (
    StopWhenDone,
    WordCount,
    arguments,
    commit_latency,
    create_topics,
    delete_topics,
    fill,
)
from confluent_kafka.admin import AdminClient

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor
from kasper_py.kafka.producer import OutputProducer
from kasper_py.stores.base import StoreRuntime, StoreSpec
from kasper_py.stores.cassandra import CassandraTable
from kasper_py.stores.memory import MemoryTable
from kasper_py.stores.opensearch import OpenSearchTable
from kasper_py.stores.postgres import PostgresTable
from kasper_py.stores.redis import RedisTable
from kasper_py.stores.rocksdb import RocksDBTable

KINDS = ("passthrough", "passthrough-eos", "memory", "rocksdb", "rocksdb-eos", "redis",
         "redis-eo", "cassandra", "cassandra-eo", "postgres", "postgres-eo",
         "opensearch", "opensearch-eo")
EXACTLY_ONCE = ("passthrough", "rocksdb")
"""The kinds whose ``-eos`` loop is compared with their at-least-once one."""


def lines(count: int) -> list[dict[str, Any]]:
    words = [f"w{i}" for i in range(1000)]
    step = 7919  # a prime: the words of consecutive lines look shuffled, deterministically
    return [{"value": " ".join(words[(n * 5 + k) * step % 1000] for k in range(5)).encode()}
            for n in range(count)]


class Passthrough(MessageProcessor):
    def __init__(self, output: str) -> None:
        self.output = output

    def process(self, messages: list[Message], sender: Sender) -> None:
        send = sender.send
        for m in messages:
            send(self.output, m.value, m.key, m.partition)


def store_spec(kind: str, args: argparse.Namespace) -> StoreSpec:
    store, _, mode = kind.partition("-")
    effectively_once = mode == "eo"
    if store == "memory":
        return MemoryTable("counts")
    if store == "rocksdb":
        return RocksDBTable("counts")
    if store == "redis":
        return RedisTable("counts", url=args.redis_url, effectively_once=effectively_once)
    if store == "postgres":
        return PostgresTable("counts", url=args.postgres_url, table="kasper_bench_counts",
                             effectively_once=effectively_once)
    if store == "opensearch":
        return OpenSearchTable("counts", url=args.opensearch_url,
                               effectively_once=effectively_once)
    host, port = args.cassandra.rsplit(":", 1)
    return CassandraTable("counts", contact_points=[host], port=int(port),
                          keyspace="kasper_bench", effectively_once=effectively_once)


def loop_child(args: argparse.Namespace) -> dict[str, Any]:
    kind = args.child
    passthrough = kind.partition("-")[0] == "passthrough"
    guarantee = "exactly_once" if kind.endswith("-eos") else "at_least_once"
    config = Config(name=f"bench-{kind}-{uuid.uuid4().hex[:8]}", bootstrap_servers=args.bootstrap,
                    input_topics=[args.source], batch_size=args.batch_size, batch_wait=1.0,
                    value_serde="bytes" if passthrough else "str", key_serde="str",
                    state_dir=args.state_dir, processing_guarantee=guarantee)
    opened: list[Any] = []

    def factory(context: ProcessorContext) -> MessageProcessor:
        if passthrough:
            return Passthrough(args.output)
        processor = WordCount(context, args.output)
        opened.append(processor.counts)
        return processor

    observer = StopWhenDone(args.messages)
    stores = [] if passthrough else [store_spec(kind, args)]
    processor = TopicProcessor(config, factory, stores=stores, observer=observer)
    observer.processor = processor
    started = time.perf_counter()
    processor.run_loop()
    elapsed = time.perf_counter() - started
    round_trips = sum(store.round_trips for store in opened)
    return {"kind": kind, "name": config.name, "seconds": elapsed,
            "msgs_per_s": args.messages / elapsed,
            "round_trips_per_batch": round_trips / max(observer.partition_batches, 1),
            **commit_latency(observer.commits)}


def restore_child(args: argparse.Namespace) -> dict[str, Any]:
    config = Config(name=f"bench-restore-{uuid.uuid4().hex[:8]}", bootstrap_servers=args.bootstrap,
                    input_topics=[args.source], state_dir=args.state_dir)
    table = RocksDBTable("counts", changelog_topic=args.output)
    producer = OutputProducer(config)
    partitions = AdminClient({"bootstrap.servers": args.bootstrap}).list_topics(
        args.output, timeout=30).topics[args.output].partitions
    started = time.perf_counter()
    for partition in partitions:
        table.open(StoreRuntime(config, partition, producer)).close()
    elapsed = time.perf_counter() - started
    table.close()
    return {"kind": "restore", "seconds": elapsed,
            "records_per_s": args.restore_records / elapsed}


def run_child(kind: str, args: argparse.Namespace, source: str, output: str) -> dict[str, Any]:
    state_dir = tempfile.mkdtemp(prefix="kasper-bench-")
    cmd = [sys.executable, __file__, "--child", kind, "--bootstrap", args.bootstrap,
           "--source", source, "--output", output, "--messages", str(args.messages),
           "--batch-size", str(args.batch_size), "--restore-records", str(args.restore_records),
           "--redis-url", args.redis_url, "--cassandra", args.cassandra,
           "--postgres-url", args.postgres_url, "--opensearch-url", args.opensearch_url,
           "--state-dir", state_dir]
    try:
        result = subprocess.run(cmd, check=True, capture_output=True, text=True)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def clean_up(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Delete what a word count left behind: its changelog topic, Redis keys, rows or
    OpenSearch index."""
    if result["kind"].startswith("rocksdb"):
        delete_topics(args.bootstrap, [f"{result['name']}-counts-changelog"])
    elif result["kind"].startswith("redis"):
        client = redis.Redis.from_url(args.redis_url)
        for pattern in (f"{result['name']}/counts/*", f"{result['name']}/counts#*"):
            keys = list(client.scan_iter(pattern, count=1000))
            if keys:
                client.unlink(*keys)
    elif result["kind"].startswith("postgres"):
        with psycopg.connect(args.postgres_url, autocommit=True) as connection:
            for table in ("kasper_bench_counts", "kasper_bench_counts_offsets"):
                connection.execute(f"DELETE FROM {table} WHERE prefix = %s", (result["name"],))
    elif result["kind"].startswith("opensearch"):
        index = f"{result['name']}-counts".lower()
        request = urllib.request.Request(f"{args.opensearch_url}/{index}", method="DELETE")
        urllib.request.urlopen(request, timeout=30).close()


def restore_bench(args: argparse.Namespace, source: str) -> dict[str, Any]:
    changelog = f"bench-changelog-{uuid.uuid4().hex[:8]}"
    create_topics(args.bootstrap, [changelog], args.partitions, **{"cleanup.policy": "compact"})
    distinct = max(args.restore_records // 10, 1)  # ten versions of each key, like counters
    fill(args.bootstrap, changelog, args.partitions,
         [{"key": b"word%07d" % (n % distinct), "value": b"%d" % n}
          for n in range(args.restore_records)])
    try:
        return run_child("restore", args, source, changelog)
    finally:
        delete_topics(args.bootstrap, [changelog])


def report(results: dict[str, list[dict[str, Any]]], restore: dict[str, Any]) -> None:
    best = {k: max(v, key=lambda r: r["msgs_per_s"]) for k, v in results.items()}
    base = best["passthrough"]["msgs_per_s"] if "passthrough" in best else float("nan")
    print(f"\n{'loop':16} {'lines/s':>10} {'x passthrough':>14} {'round trips/batch':>18} "
          f"{'commit ms p50/max':>18}")
    for kind, r in best.items():
        trips = "" if kind.startswith("passthrough") else f"{r['round_trips_per_batch']:.2f}"
        commit = f"{r['commit_ms_p50']:.1f} / {r['commit_ms_max']:.1f}" if r["commits"] else "-"
        print(f"{kind:16} {r['msgs_per_s']:>10,.0f} {r['msgs_per_s'] / base:>14.2f} {trips:>18} "
              f"{commit:>18}")
    print(f"rocksdb restore: {restore['records_per_s']:,.0f} records/s "
          f"({restore['seconds']:.2f} s; target >= 100,000)")
    ratio = best["rocksdb"]["msgs_per_s"] / base if "rocksdb" in best else float("nan")
    print(f"rocksdb word count / passthrough: {ratio:.2f} (target >= 0.5)")
    for kind in EXACTLY_ONCE:
        if kind in best and f"{kind}-eos" in best:
            ratio = best[f"{kind}-eos"]["msgs_per_s"] / best[kind]["msgs_per_s"]
            print(f"{kind} exactly-once / at-least-once, lines/s: {ratio:.2f} "
                  "(target >= 0.85 at batch 10,000)")


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], messages=200_000, partitions=2)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:16379/0")
    parser.add_argument("--cassandra", default="127.0.0.1:19042", help="host:port")
    parser.add_argument("--postgres-url",
                        default="postgresql://postgres@127.0.0.1:15432/postgres")
    parser.add_argument("--opensearch-url", default="http://127.0.0.1:19200")
    parser.add_argument("--restore-records", type=int, default=1_000_000)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--child", choices=[*KINDS, "restore"])
    parser.add_argument("--state-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
        run = restore_child if args.child == "restore" else loop_child
        print(json.dumps(run(args)))
        return
    source = f"bench-lines-{uuid.uuid4().hex[:8]}"
    output = f"bench-out-{uuid.uuid4().hex[:8]}"
    create_topics(args.bootstrap, [source, output], args.partitions)
    fill(args.bootstrap, source, args.partitions, lines(args.messages))
    print(f"input: {args.messages} lines of 5 words on {args.partitions} partitions, "
          f"batch_size {args.batch_size}")
    results: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.rounds):  # alternate, so every loop sees the same machine conditions
        for kind in args.kinds.split(","):
            r = run_child(kind, args, source, output)
            clean_up(args, r)
            results.setdefault(kind, []).append(r)
            print(f"  {kind:16} {r['msgs_per_s']:>10,.0f} lines/s")
    restore = restore_bench(args, source)
    report(results, restore)
    delete_topics(args.bootstrap, [source, output])


if __name__ == "__main__":
    main()
