"""`kasper run | offsets | lag` as a user runs them: a subprocess against the stack's
Kafka, with the tiny processor in examples_module.py. Fresh topics and group per test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.kafka_clients import AdminClient, Consumer, Producer

sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import wait_for  # isort: skip  # noqa: E402 - after register_assert_rewrite

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
SECRET = "cli-secret-never-printed"
N = 30


def kasper_command() -> list[str]:
    """The installed console script, else ``python -m kasper_py``."""
    script = Path(sys.executable).parent / "kasper"
    return [str(script)] if script.exists() else [sys.executable, "-m", "kasper_py"]


def cli_env(bootstrap: str, output_topic: str = "", **extra: str) -> dict[str, str]:
    """The environment of a CLI run: the broker, the example's output topic, a secret."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KASPER_")}
    env.update(KASPER_BOOTSTRAP_SERVERS=bootstrap, EXAMPLE_OUTPUT_TOPIC=output_topic,
               KASPER_CLIENT__SASL_PASSWORD=SECRET, **extra)
    return env


def kasper(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run one CLI command to completion."""
    return subprocess.run([*kasper_command(), *args], capture_output=True, text=True, env=env,
                          timeout=90, check=False)


def write_config(tmp_path: Path, name: str, topic: str, **fields: Any) -> str:
    """A kasper.toml for ``name`` reading ``topic``."""
    lines = [f'name = "{name}"', f'input_topics = ["{topic}"]', "batch_wait = 0.5"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in fields.items()]
    path = tmp_path / "kasper.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def run_args(config: str, *extra: str) -> list[str]:
    """`kasper run` of the example processor with its store."""
    return ["run", "examples_module:factory", "--stores", "examples_module:stores",
            "--app-dir", str(HERE), "--config", config, *extra]


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON log lines of a run's stderr (other lines are skipped)."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]




def test_run_processes_input_and_commits(bootstrap: str, new_topic: Callable[..., str],
                                         kafka: Any, unique_name: Callable[[str], str],
                                         tmp_path: Path) -> None:
    """`kasper run --until-caught-up` upper-cases every input message to the output
    topic, commits every input offset, logs one JSON batch line per partition per turn,
    and never prints the SASL password given through the environment."""
    source, sink = new_topic("cli-in", partitions=2), new_topic("cli-out", partitions=2)
    kafka.produce(source, [(f"k{i % 3}".encode(), f"v{i}".encode()) for i in range(N)])
    name = unique_name("cli-run")
    config = write_config(tmp_path, name, source, batch_size=7)
    result = kasper(*run_args(config, "--until-caught-up"), env=cli_env(bootstrap, sink))
    assert result.returncode == 0, result.stderr
    outputs = sorted(m.value() for m in kafka.read_all(sink))
    assert outputs == sorted(f"V{i}".encode() for i in range(N))
    committed = kafka.committed(name, source, partitions=2)
    assert sum(offset or 0 for offset in committed.values()) == N
    batches = [e for e in json_lines(result.stderr) if e["event"] == "kasper.batch"]
    assert sum(e["consumed"] for e in batches) == N
    assert {e["processor"] for e in batches} == {name}
    assert SECRET not in result.stderr + result.stdout


def test_sigterm_closes_gracefully(bootstrap: str, new_topic: Callable[..., str], kafka: Any,
                                   unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """SIGTERM during `kasper run` finishes the batch in hand, commits, closes, exits 0."""
    source, sink = new_topic("sig-in"), new_topic("sig-out")
    kafka.produce(source, [f"m{i}".encode() for i in range(N)])
    name = unique_name("cli-sig")
    log_path = tmp_path / "stderr.log"
    with log_path.open("w") as log:
        process = subprocess.Popen([*kasper_command(), *run_args(
            write_config(tmp_path, name, source))], stderr=log, env=cli_env(bootstrap, sink))
    try:
        wait_for(lambda: kafka.committed(name, source)[0] == N, "the input to be committed")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    events = [e["event"] for e in json_lines(log_path.read_text())]
    assert events[-2:] == ["kasper.closed", "kasper.stopped_by_signal"]


@contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """SIGTERM and SIGINT blocked on this thread: a process started meanwhile starts with
    them blocked, so one sent to it at once waits, pending, until kasper's handlers are
    in place (it unblocks them then), however slowly the interpreter starts."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@pytest.mark.parametrize("delay", [None, 0.2, 0.5, 1.0, 2.0])
def test_sigterm_right_after_start_exits_0(bootstrap: str, new_topic: Callable[..., str],  # noqa: PLR0917
                                           kafka: Any, unique_name: Callable[[str], str],
                                           tmp_path: Path, delay: float | None) -> None:
    """SIGTERM while `kasper run` imports, reads its configuration, connects or runs its
    first turns (``None``: the moment it starts) stops it cleanly: exit 0, no
    traceback, and no input committed without its output. The stop signals are blocked
    when it starts (as a supervisor that forwards signals can): a signal before Python
    runs any of kasper's code, which a loaded machine's slow start makes likely at 0.2 s,
    kills any Python program; blocked, it waits until kasper's handlers are in place."""
    source, sink = new_topic("early-in"), new_topic("early-out")
    kafka.produce(source, [f"m{i}".encode() for i in range(N)])
    name = unique_name("cli-early")
    command = [*kasper_command(), *run_args(write_config(tmp_path, name, source))]
    with stop_signals_blocked():
        process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                                   env=cli_env(bootstrap, sink))
    time.sleep(delay or 0)
    process.send_signal(signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    assert "kasper.stopped_by_signal" in stderr
    assert len(kafka.read_all(sink)) >= (kafka.committed(name, source)[0] or 0)


def test_processor_failure_exits_1_without_committing(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """A process() that raises stops the run with exit 1 and one line naming the
    partition and the cause; the failing batch stays uncommitted."""
    source, sink = new_topic("fail-in"), new_topic("fail-out")
    kafka.produce(source, [f"m{i}".encode() for i in range(10)])
    name = unique_name("cli-fail")
    result = kasper(*run_args(write_config(tmp_path, name, source), "--until-caught-up"),
                    env=cli_env(bootstrap, sink, EXAMPLE_FAIL_ON="m3"))
    assert result.returncode == 1
    [error_line] = [line for line in result.stderr.splitlines() if line.startswith("kasper:")]
    assert "partition 0" in error_line and "ValueError" in error_line
    assert "Traceback" not in result.stderr
    committed = kafka.committed(name, source)[0]
    assert committed is None or committed <= 3


def produce_at(bootstrap: str, topic: str, timestamps_ms: list[int]) -> None:
    """One message per timestamp (CreateTime), in order, to partition 0."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for i, timestamp in enumerate(timestamps_ms):
        producer.produce(topic, value=f"t{i}".encode(), partition=0, timestamp=timestamp)
    assert producer.flush(30) == 0


def test_offsets_show_lag_and_reset(bootstrap: str, new_topic: Callable[..., str], kafka: Any,
                                    unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """After a run, `lag` is 0; `offsets reset` moves the group to earliest, to a time
    (offsets_for_times) and, with --dry-run, nowhere; `offsets show` and `lag` agree."""
    source, sink = new_topic("off-in"), new_topic("off-out")
    # An hour ago: the stack's broker deletes data older than its 24 h retention.
    base = (int(time.time()) - 3600) * 1000
    produce_at(bootstrap, source, [base + i * 1000 for i in range(20)])
    name = unique_name("cli-off")
    config = write_config(tmp_path, name, source)
    env = cli_env(bootstrap, sink)
    assert kasper(*run_args(config, "--until-caught-up"), env=env).returncode == 0
    assert f"total lag of group {name}: 0 messages" in kasper("lag", "-c", config, env=env).stdout

    reset = kasper("offsets", "reset", "--to", "earliest", "-c", config, env=env)
    assert reset.returncode == 0, reset.stderr
    assert kafka.committed(name, source)[0] == 0
    assert "total lag" in (lag := kasper("lag", "-c", config, env=env).stdout) and ": 20 " in lag

    moment = datetime.fromtimestamp((base + 10_000) / 1000, tz=UTC).isoformat()
    assert kasper("offsets", "reset", "--to", moment, "-c", config, env=env).returncode == 0
    assert kafka.committed(name, source)[0] == 10

    dry = kasper("offsets", "reset", "--to", "latest", "--dry-run", "-c", config, env=env)
    assert dry.returncode == 0 and "dry run" in dry.stdout
    assert kafka.committed(name, source)[0] == 10
    show = kasper("offsets", "show", "-c", config, env=env).stdout.splitlines()
    assert show[2].split() == [source, "0", "10", "0", "20", "10", "-"]  # no member now


def test_until_caught_up_returns_when_records_past_the_commit_were_deleted(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """Records past the group's committed offset deleted (retention, ``delete_records``):
    the consumer resets to the topic's start, finds nothing, and ``--until-caught-up``
    returns (it once waited forever, counting the deleted records as lag); the next
    record produced is processed and committed."""
    from confluent_kafka import TopicPartition as Tp

    source, sink = new_topic("del-in"), new_topic("del-out")
    kafka.produce(source, [(b"k", f"v{i}".encode()) for i in range(10)])
    name = unique_name("cli-del")
    config = write_config(tmp_path, name, source)
    env = cli_env(bootstrap, sink)
    assert kasper(*run_args(config, "--until-caught-up"), env=env).returncode == 0
    kafka.produce(source, [(b"k", f"w{i}".encode()) for i in range(10)])
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures need it
    for future in admin.delete_records([Tp(source, 0, 20)]).values():
        future.result(30)
    assert kafka.committed(name, source)[0] == 10  # below the topic's start, 20, now
    result = kasper(*run_args(config, "--until-caught-up"), env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    kafka.produce(source, [(b"k", b"x")])
    assert kasper(*run_args(config, "--until-caught-up"), env=env).returncode == 0
    assert sorted(m.value() for m in kafka.read_all(sink)) == sorted(
        [f"V{i}".encode() for i in range(10)] + [b"X"])
    assert kafka.committed(name, source)[0] == 21


def test_reset_refused_while_the_group_has_members(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """While a consumer is a member of the group, `offsets reset` exits 5 and names the
    member; the committed offsets do not move."""
    source = new_topic("busy-in")
    kafka.produce(source, [b"x"] * 3)
    name = unique_name("cli-busy")
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": name,
                       "client.id": "busy-member", "enable.auto.commit": False})
    assigned: list[Any] = []
    member.subscribe([source], on_assign=lambda _c, partitions: assigned.extend(partitions))
    try:
        wait_for(lambda: bool(member.poll(0.2) or assigned), "the member's assignment")
        result = kasper("offsets", "reset", "--to", "latest", "-c",
                        write_config(tmp_path, name, source), env=cli_env(bootstrap))
    finally:
        member.close()
    assert result.returncode == 5, result.stderr
    assert "is active" in result.stderr and "busy-member" in result.stderr
    assert kafka.committed(name, source)[0] is None


def test_reset_refused_while_a_loop_runs_allowed_once_it_stopped(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """A running `kasper run` is no group member (static assignment), yet `offsets reset`
    exits 5 naming it, from its commit note; `offsets show` says it runs. After SIGTERM
    its last commit says it stopped and the same reset goes through. A loop killed with
    -9 leaves a running note: refused again until --force."""
    source, sink = new_topic("run-in"), new_topic("run-out")
    kafka.produce(source, [f"m{i}".encode() for i in range(N)])
    name = unique_name("cli-live")
    config, env = write_config(tmp_path, name, source), cli_env(bootstrap, sink)

    def start() -> subprocess.Popen[bytes]:
        process = subprocess.Popen([*kasper_command(), *run_args(config)],
                                   stderr=subprocess.DEVNULL, env=env)
        wait_for(lambda: kafka.committed(name, source)[0] == N, "the input to be committed")
        return process

    process = start()
    try:
        refused = kasper("offsets", "reset", "--to", "earliest", "-c", config, env=env)
        assert refused.returncode == 5, refused.stderr
        assert "is being processed: a kasper loop is running on" in refused.stderr
        assert f"(pid {process.pid})" in refused.stderr
        show = kasper("offsets", "show", "-c", config, env=env).stdout
        assert "last commit by a kasper loop: running on" in show
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert kafka.committed(name, source)[0] == N
    done = kasper("offsets", "reset", "--to", "earliest", "-c", config, env=env)
    assert done.returncode == 0, done.stderr
    assert kafka.committed(name, source)[0] == 0

    process = start()
    process.kill()
    process.wait(timeout=30)
    killed = kasper("offsets", "reset", "--to", "latest", "-c", config, env=env)
    assert killed.returncode == 5 and "pass --force if it is gone" in killed.stderr
    assert kafka.committed(name, source)[0] == N
    forced = kasper("offsets", "reset", "--to", "earliest", "--force", "-c", config, env=env)
    assert forced.returncode == 0, forced.stderr
    assert kafka.committed(name, source)[0] == 0


def test_reset_to_offset_skips_a_poison_record(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """The recovery path of docs/operations.md: a record that fails every run stops the
    loop at its offset; `--to-offset TOPIC:1=<offset + 1>` moves that partition alone
    (a dry run and an out-of-range offset move nothing), the next run finishes, and a
    running loop refuses the reset."""
    source, sink = new_topic("poison-in", partitions=2), new_topic("poison-out", partitions=2)
    kafka.produce(source, [f"a{i}".encode() for i in range(10)], partition=0)
    kafka.produce(source, [b"p0", b"p1", b"p2", b"poison", b"p4", b"p5"], partition=1)
    name = unique_name("cli-poison")
    config, env = write_config(tmp_path, name, source, batch_size=1), cli_env(bootstrap, sink)
    failed = kasper(*run_args(config, "--until-caught-up"),
                    env={**env, "EXAMPLE_FAIL_ON": "poison"})
    assert failed.returncode == 1 and f"{source}[1] offsets 3..3" in failed.stderr
    before = kafka.committed(name, source, partitions=2)
    assert before[1] == 3

    def reset(*args: str) -> subprocess.CompletedProcess[str]:
        return kasper("offsets", "reset", *args, "-c", config, env=env)

    dry = reset("--to-offset", f"{source}:1=4", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert [line.split() for line in dry.stdout.splitlines()[:2]] == [
        ["TOPIC", "PARTITION", "COMMITTED", "NEW"], [source, "1", "3", "4"]]
    outside = reset("--to-offset", f"{source}:1=7")
    assert outside.returncode == 2
    assert f"topic {source!r} partition 1 holds offsets 0..6" in outside.stderr
    assert kafka.committed(name, source, partitions=2) == before

    done = reset("--to-offset", f"{source}:1=4")
    assert done.returncode == 0, done.stderr
    assert f"group {name}: 1 partitions reset to {source}:1=4" in done.stdout
    assert kafka.committed(name, source, partitions=2) == {0: before[0], 1: 4}
    rerun = kasper(*run_args(config, "--until-caught-up"), env={**env, "EXAMPLE_FAIL_ON": "poison"})
    assert rerun.returncode == 0, rerun.stderr
    assert kafka.committed(name, source, partitions=2) == {0: 10, 1: 6}
    assert b"POISON" not in {m.value() for m in kafka.read_all(sink)}

    kafka.produce(source, [b"p6"], partition=1)
    process = subprocess.Popen([*kasper_command(), *run_args(config)],
                               stderr=subprocess.DEVNULL, env=env)
    try:
        wait_for(lambda: kafka.committed(name, source, partitions=2)[1] == 7,
                 "the new record to be committed")
        refused = reset("--to-offset", f"{source}:1=6")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert refused.returncode == 5 and "is being processed" in refused.stderr
    assert kafka.committed(name, source, partitions=2)[1] == 7


def test_run_exactly_once_says_so_and_commits_in_transactions(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """`kasper run --processing-guarantee exactly_once` logs the mode and its
    transactional id at start; a read_committed reader sees every output once and the
    input offsets are committed (through the transactions)."""
    source, sink = new_topic("cli-eos-in", partitions=2), new_topic("cli-eos-out", partitions=2)
    kafka.produce(source, [(f"k{i % 3}".encode(), f"v{i}".encode()) for i in range(N)])
    name = unique_name("cli-eos")
    config = write_config(tmp_path, name, source, batch_size=7)
    result = kasper(*run_args(config, "--until-caught-up", "--processing-guarantee",
                              "exactly_once"), env=cli_env(bootstrap, sink))
    assert result.returncode == 0, result.stderr
    started = [e for e in json_lines(result.stderr) if e["event"] == "kasper.started"]
    assert [(e["processing_guarantee"], e["transactional_id"]) for e in started] == [
        ("exactly_once", f"{name}@all")]
    assert sorted(m.value() for m in kafka.read_all(sink)) == sorted(
        f"V{i}".encode() for i in range(N))
    assert sum(o or 0 for o in kafka.committed(name, source, partitions=2).values()) == N


def test_run_refuses_partitions_another_loop_is_running(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """While `kasper run` processes a topic, a second `kasper run` of the same processor
    exits 5 naming the first one's pid; `--force` lets it start."""
    source, sink = new_topic("cli-busy-in"), new_topic("cli-busy-out")
    kafka.produce(source, [(b"k", f"v{i}".encode()) for i in range(N)])
    name = unique_name("cli-busy")
    config = write_config(tmp_path, name, source, batch_size=1)
    env = cli_env(bootstrap, sink)
    first = subprocess.Popen([*kasper_command(), *run_args(config)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: sum(o or 0 for o in kafka.committed(name, source).values()) > 0,
                 "the first loop to commit")
        refused = kasper(*run_args(config, "--until-caught-up"), env=env)
        assert refused.returncode == 5, refused.stderr
        assert "refused to start" in refused.stderr and f"(pid {first.pid})" in refused.stderr
        forced = kasper(*run_args(config, "--until-caught-up", "--force"), env=env)
        assert forced.returncode == 0, forced.stderr
    finally:
        first.terminate()
        first.wait(60)
