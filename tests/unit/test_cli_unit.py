"""The ``kasper`` CLI without a broker: configuration precedence (TOML, environment,
flags), errors that name the field, exit codes, argument parsing and progress."""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog
from confluent_kafka import KafkaError

import kasper_py.kafka.admin
import kasper_py.stack
from kasper_py import Config, TopicError
from kasper_py.cli import (
    EXIT_BROKER,
    EXIT_CONFIG,
    CliError,
    load_config,
)
from kasper_py.cli import commands as cli
from kasper_py.cli import offsets as offsets_cli
from kasper_py.cli.base import exit_code, print_error
from kasper_py.cli.offsets import Progress
from kasper_py.kafka.offsets import PartitionProgress as PartitionOffsets
from kasper_py.observability.observe import NoopObserver, with_store_observer

TOML = """
name = "orders"
bootstrap_servers = "file:9092"
input_topics = ["orders", "payments"]
batch_size = 100
batch_wait = 2.5

[client_overrides]
"sasl.username" = "app"
"sasl.password" = "from-file"
"""


@pytest.fixture
def toml_file(tmp_path: Path) -> str:
    """A valid kasper.toml."""
    path = tmp_path / "kasper.toml"
    path.write_text(TOML)
    return str(path)


def test_toml_file_alone(toml_file: str) -> None:
    """Every TOML key becomes the Config field of that name."""
    config = load_config(toml_file, {})
    assert config.name == "orders" and config.input_topics == ("orders", "payments")
    assert config.batch_size == 100 and config.batch_wait == 2.5
    assert config.client_overrides["sasl.username"] == "app"


def test_environment_overrides_file_and_flags_override_both(toml_file: str) -> None:
    """KASPER_* variables beat the file; flags beat both."""
    env = {"KASPER_BATCH_SIZE": "200", "KASPER_BOOTSTRAP_SERVERS": "env:9092",
           "KASPER_BATCH_WAIT": "0.5"}
    config = load_config(toml_file, env, {"batch_size": 300, "batch_wait": None})
    assert config.batch_size == 300
    assert config.bootstrap_servers == "env:9092"
    assert config.batch_wait == 0.5


def test_environment_value_types() -> None:
    """Lists are comma-separated, numbers parsed, 'none' clears an optional field."""
    env = {"KASPER_NAME": "n", "KASPER_BOOTSTRAP_SERVERS": "b:1",
           "KASPER_INPUT_TOPICS": "a, b", "KASPER_INPUT_PARTITIONS": "2,0",
           "KASPER_METRICS_PORT": "none", "KASPER_DELIVERY_TIMEOUT": "30",
           "KASPER_AUTO_OFFSET_RESET": "latest"}
    config = load_config(None, env)
    assert config.input_topics == ("a", "b") and config.input_partitions == (0, 2)
    assert config.metrics_port is None and config.delivery_timeout == 30.0
    assert config.auto_offset_reset == "latest"


def test_client_override_variables_merge_per_key(toml_file: str) -> None:
    """KASPER_CLIENT__SASL_PASSWORD sets client_overrides['sasl.password'] and keeps the
    file's other keys; CONSUMER__ and PRODUCER__ fill their own mappings."""
    env = {"KASPER_CLIENT__SASL_PASSWORD": "from-env",
           "KASPER_CONSUMER__FETCH_MAX_BYTES": "1048576",
           "KASPER_PRODUCER__LINGER_MS": "20"}
    config = load_config(toml_file, env)
    assert config.client_overrides == {"sasl.username": "app", "sasl.password": "from-env"}
    assert config.consumer_overrides == {"fetch.max.bytes": "1048576"}
    assert config.producer_overrides == {"linger.ms": "20"}


def test_invalid_value_names_field_and_source(toml_file: str) -> None:
    """A bad value is a CliError with the config exit code, the field and its origin."""
    with pytest.raises(CliError) as caught:
        load_config(toml_file, {"KASPER_BATCH_SIZE": "0"})
    assert caught.value.code == EXIT_CONFIG
    assert "'batch_size'" in str(caught.value) and "environment" in str(caught.value)


def test_unparsable_environment_number_names_the_variable() -> None:
    """KASPER_BATCH_SIZE=abc names the field and the variable."""
    with pytest.raises(CliError, match=r"'batch_size'.*KASPER_BATCH_SIZE='abc'"):
        load_config(None, {"KASPER_BATCH_SIZE": "abc"})


def test_missing_required_field_says_how_to_set_it() -> None:
    """Without a name the error names the field and its three sources."""
    with pytest.raises(CliError, match=r"'name': missing.*KASPER_NAME.*--name"):
        load_config(None, {"KASPER_BOOTSTRAP_SERVERS": "b:1", "KASPER_INPUT_TOPICS": "t"})


def test_unknown_toml_key_is_named(tmp_path: Path) -> None:
    """A misspelt key is refused rather than silently ignored."""
    path = tmp_path / "k.toml"
    path.write_text('name = "n"\nbatchsize = 5\n')
    with pytest.raises(CliError, match="unknown config field 'batchsize'") as caught:
        load_config(str(path), {})
    assert caught.value.code == EXIT_CONFIG


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    """Unreadable configuration is a config error with the file name."""
    path = tmp_path / "bad.toml"
    path.write_text("name = \n")
    with pytest.raises(CliError, match="not valid TOML") as caught:
        load_config(str(path), {})
    assert caught.value.code == EXIT_CONFIG
    with pytest.raises(CliError, match="not found"):
        load_config(str(tmp_path / "absent.toml"), {})


def test_overrides_must_be_a_table(tmp_path: Path) -> None:
    """client_overrides given as a string names the field."""
    path = tmp_path / "k.toml"
    path.write_text('client_overrides = "sasl.password=x"\n')
    with pytest.raises(CliError, match="'client_overrides'"):
        load_config(str(path), {})


@pytest.mark.parametrize(("text", "expected"), [
    ("earliest", "earliest"),
    ("latest", "latest"),
    ("1700000000000", 1_700_000_000_000),
    ("2023-11-14T22:13:20+00:00", 1_700_000_000_000),
    ("2023-11-14T22:13:20", 1_700_000_000_000),  # no zone: UTC
    ("2023-11-14T23:13:20+01:00", 1_700_000_000_000),
])
def test_reset_targets(text: str, expected: str | int) -> None:
    """--to takes earliest, latest, epoch milliseconds or an ISO-8601 time."""
    assert offsets_cli.reset_target(text) == expected


def test_reset_target_rejects_anything_else() -> None:
    """Anything else is a usage error naming the accepted forms."""
    with pytest.raises(argparse.ArgumentTypeError, match="ISO-8601"):
        offsets_cli.reset_target("yesterday")


def test_lag_without_a_commit_follows_the_reset_policy() -> None:
    """With nothing committed, lag counts from the low watermark (earliest) or is 0."""
    row = PartitionOffsets("t", 0, None, low=10, high=50)
    assert row.lag("earliest") == 40 and row.lag("latest") == 0
    assert PartitionOffsets("t", 0, 45, 10, 50).lag("earliest") == 5


def test_stack_is_delegated(monkeypatch: pytest.MonkeyPatch) -> None:
    """`kasper stack ...` passes its arguments untouched to kasper_py.stack.main."""
    seen: list[list[str]] = []
    monkeypatch.setattr(kasper_py.stack, "main", lambda argv: seen.append(argv) or 7)
    assert cli.main(["stack", "down", "--purge", "kafka"]) == 7
    assert seen == [["down", "--purge", "kafka"]]


def test_progress_redraws_one_line_on_a_terminal() -> None:
    """On a terminal progress is redrawn in place and ends with a newline."""

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream, now = Tty(), [0.0]
    progress = Progress("resetting", 4, stream=stream, clock=lambda: now[0])
    for _ in range(4):
        now[0] += 1
        progress.advance()
    progress.finish()
    text = stream.getvalue()
    assert "\rresetting: 2/4 (50%)" in text and text.endswith("4/4 (100%)\n")


def test_progress_is_silent_off_a_terminal_for_quick_work() -> None:
    """Off a terminal nothing is drawn (long work logs kasper.progress lines instead)."""
    stream = io.StringIO()
    progress = Progress("reading offsets", 2, stream=stream)
    progress.advance(2)
    progress.finish()
    assert stream.getvalue() == ""


def test_restore_display_hears_the_stores_through_the_observer_port() -> None:
    """`kasper run` gives its stores an observer that also feeds the restore display:
    a restore with nothing to read draws nothing, a finished one logs its last line."""
    observer = with_store_observer(NoopObserver(), cli._RestoreDisplay())
    with structlog.testing.capture_logs() as logs:
        observer.store_observer().on_restore_progress("counts", 1, 0, 0)
        observer.store_observer().on_restore_progress("counts", 2, 40, 200)
        observer.store_observer().on_restore_progress("counts", 2, 200, 200)
    assert [(e["task"], e["done"], e["total"]) for e in logs
            if e["event"] == "kasper.progress"] == [("restoring counts[2]", 200, 200)]


def kasper(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a fresh interpreter, as a user would."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("KASPER_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "kasper_py", *args], capture_output=True,
                          text=True, env=full_env, timeout=60, check=False)


BASE = ["--name", "p", "--bootstrap-servers", "127.0.0.1:1", "--input-topics", "t"]


def test_bad_config_exit_code_and_message_without_traceback() -> None:
    """A bad field exits with the config code and one line naming it, no traceback."""
    result = kasper("run", "mod:factory", *BASE, env={"KASPER_BATCH_WAIT": "-1"})
    assert result.returncode == EXIT_CONFIG
    assert "config field 'batch_wait'" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_target_is_a_config_error(tmp_path: Path) -> None:
    """A target that does not import names the missing module."""
    result = kasper("run", "no_such_module:factory", *BASE, "--app-dir", str(tmp_path))
    assert result.returncode == EXIT_CONFIG
    assert "no module named 'no_such_module'" in result.stderr
    assert "Traceback" not in result.stderr


APP = """
from kasper_py import Task

factory = print

def event_time(message):
    return message.timestamp

def nightly(timestamp, sender):
    pass

tasks = [Task(nightly, cron="0 3 * * *")]
not_tasks = [nightly]
"""


@pytest.mark.parametrize(("extractor", "code", "text"), [
    ("proc:event_time", EXIT_BROKER, "cannot reach Kafka"),
    ("proc:missing", EXIT_CONFIG, "config field 'timestamp_extractor': 'proc:missing': 'proc' "
                                  "has no attribute 'missing'"),
    ("nonsense", EXIT_CONFIG, "config field 'timestamp_extractor': must be a function of a "
                              "Message, or its name as 'module:function', got 'nonsense'"),
])
def test_the_timestamp_extractor_is_imported_from_the_app_dir_before_connecting(
        tmp_path: Path, extractor: str, code: int, text: str) -> None:
    """KASPER_TIMESTAMP_EXTRACTOR names a function in --app-dir: a good one lets the run
    go on to the broker (unreachable here); a bad one is a config error naming it."""
    (tmp_path / "proc.py").write_text(APP)
    result = kasper("run", "proc:factory", *BASE, "--app-dir", str(tmp_path),
                    "--connect-timeout", "1", env={"KASPER_TIMESTAMP_EXTRACTOR": extractor})
    assert result.returncode == code
    assert text in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("tasks", "code", "text"), [
    ("proc:tasks", EXIT_BROKER, "cannot reach Kafka"),
    ("proc:not_tasks", EXIT_CONFIG, "--tasks 'proc:not_tasks' must give a sequence of Task"),
    ("proc:nope", EXIT_CONFIG, "--tasks 'proc:nope': 'proc' has no attribute 'nope'"),
])
def test_run_takes_tasks_from_the_app(tmp_path: Path, tasks: str, code: int, text: str
                                      ) -> None:
    """kasper run --tasks module:attr: a sequence of Task, checked before connecting."""
    (tmp_path / "proc.py").write_text(APP)
    result = kasper("run", "proc:factory", *BASE, "--app-dir", str(tmp_path), "--tasks",
                    tasks, "--connect-timeout", "1")
    assert result.returncode == code
    assert text in result.stderr


def test_a_bad_cron_expression_in_the_app_is_a_config_error(tmp_path: Path) -> None:
    """The Task raises ConfigError as the app module is imported: exit 3, the cron text."""
    (tmp_path / "proc.py").write_text(APP.replace("0 3 * * *", "0 25 * * *"))
    result = kasper("run", "proc:factory", *BASE, "--app-dir", str(tmp_path), "--tasks",
                    "proc:tasks", "--connect-timeout", "1")
    assert result.returncode == EXIT_CONFIG
    assert "cron '0 25 * * *' is not a valid cron expression" in result.stderr


def test_unreachable_broker_has_its_own_exit_code(tmp_path: Path) -> None:
    """No broker at the address: exit 4, the address and the cause, no traceback."""
    (tmp_path / "proc.py").write_text("factory = print\n")
    result = kasper("lag", *BASE, "--connect-timeout", "1")
    assert result.returncode == EXIT_BROKER
    assert "cannot reach Kafka at 127.0.0.1:1" in result.stderr
    assert "Traceback" not in result.stderr
    result = kasper("run", "proc:factory", *BASE, "--app-dir", str(tmp_path),
                    "--connect-timeout", "1")
    assert result.returncode == EXIT_BROKER


def test_secret_from_the_environment_stays_out_of_errors() -> None:
    """A failing run never prints a secret given through KASPER_CLIENT__*."""
    result = kasper("run", "mod:factory", *BASE, "--batch-size", "0",
                    env={"KASPER_CLIENT__SASL_PASSWORD": "hunter2-secret"})
    assert result.returncode == EXIT_CONFIG
    assert "hunter2-secret" not in result.stderr + result.stdout


def test_errors_of_every_command_are_scrubbed(capsys: pytest.CaptureFixture[str]) -> None:
    """`kasper` and `kasper reprocess` print errors through one function, which hides
    a configured secret a librdkafka message may quote."""
    Config(name="p", bootstrap_servers="h:1", input_topics=["t"],
           client_overrides={"sasl.password": "Quoted-Secret-31"})
    print_error("kasper reprocess", "Invalid value 'Quoted-Secret-31' for sasl.password")
    err = capsys.readouterr().err
    assert err.startswith("kasper reprocess: error: Invalid value") and "Quoted" not in err


def test_usage_errors_exit_2() -> None:
    """argparse's usage errors keep their conventional code."""
    assert kasper("offsets", "reset", "--to", "yesterday", *BASE).returncode == 2


class FakeAdmin:
    """Stands in for the process's shared AdminClient: a group description and a
    per-partition alter result."""

    def __init__(self, state: str, members: list[str], alter_error: int | None) -> None:
        self.state, self.members, self.alter_error = state, members, alter_error

    def describe_consumer_groups(self, groups: list[str], **_: object) -> dict[str, Any]:
        description = SimpleNamespace(
            state=SimpleNamespace(name=self.state),
            members=[SimpleNamespace(client_id=c, host="/10.0.0.1", assignment=None)
                     for c in self.members])
        return {groups[0]: done(description)}

    def alter_consumer_group_offsets(self, requests: list[Any], **_: object) -> dict[str, Any]:
        error = None if self.alter_error is None else KafkaError(self.alter_error)
        partitions = [SimpleNamespace(topic=tp.topic, partition=tp.partition, error=error)
                      for tp in requests[0].topic_partitions]
        return {requests[0].group_id: done(SimpleNamespace(topic_partitions=partitions))}


def done(result: object) -> Future[object]:
    """A future that already holds ``result``."""
    future: Future[object] = Future()
    future.set_result(result)
    return future


def config_for_reset() -> Config:
    """A Config whose group the fake admin describes."""
    return Config(name="grp", bootstrap_servers="127.0.0.1:1", input_topics=["t"])


@pytest.mark.parametrize(("state", "members"), [("STABLE", ["c1"]),
                                                ("PREPARING_REBALANCING", [])])
def test_reset_refuses_an_active_group(monkeypatch: pytest.MonkeyPatch, state: str,
                                       members: list[str]) -> None:
    """Members, or a rebalance in progress, make the reset exit 5 naming the state."""
    monkeypatch.setattr(kasper_py.kafka.admin, "shared_client",
                        lambda _config: (FakeAdmin(state, members, None), []))
    config = config_for_reset()
    with pytest.raises(CliError, match=f"is active \\({state.lower()}") as caught:
        offsets_cli.refuse_if_active(config, offsets_cli.admin_for(config, 1.0))
    assert caught.value.code == cli.EXIT_REFUSED


def test_reset_refused_by_kafka_when_a_member_joins_in_between(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Kafka answers UNKNOWN_MEMBER_ID per partition when the group gained a member
    after the check: that is a refusal (exit 5), not a generic failure."""
    fake = FakeAdmin("EMPTY", [], KafkaError.UNKNOWN_MEMBER_ID)
    monkeypatch.setattr(kasper_py.kafka.admin, "shared_client", lambda _config: (fake, []))
    config = config_for_reset()
    with pytest.raises(CliError, match="became active") as caught:
        offsets_cli.alter_offsets(config, offsets_cli.admin_for(config, 1.0), {("t", 0): 5})
    assert caught.value.code == cli.EXIT_REFUSED


def test_toml_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    """A config file in another encoding is exit 3 naming the file, not a traceback."""
    path = tmp_path / "latin1.toml"
    path.write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(CliError, match=re.escape("latin1.toml' is not valid TOML")) as caught:
        load_config(str(path), {})
    assert caught.value.code == EXIT_CONFIG


def test_a_topic_error_is_a_config_error() -> None:
    """A missing input topic or partition (TopicError, from kasper_py.kafka.topics) exits 3 in
    `kasper run`, `kasper lag`, `kasper offsets`; the reprocess command maps it the same."""
    assert exit_code(TopicError("input topic 't': does not exist on h:1")) == EXIT_CONFIG
    assert exit_code(CliError(EXIT_BROKER, "unreachable")) == EXIT_BROKER
    assert exit_code(RuntimeError("bug")) == cli.EXIT_FAILED


def test_refused_consumer_overrides_are_a_config_error() -> None:
    """A consumer override librdkafka rejects (read by lag and offsets) is exit 3
    naming the overrides, not a KafkaException traceback."""
    config = Config(name="p", bootstrap_servers="h:1", input_topics=["t"],
                    consumer_overrides={"fetch.min.bytes": "abc"})
    with pytest.raises(CliError, match="librdkafka refused client_overrides/"
                                       "consumer_overrides") as caught:
        offsets_cli.admin_for(config, 1.0)
    assert caught.value.code == EXIT_CONFIG


@pytest.mark.parametrize(("text", "expected"), [
    ("orders:3=1234", ("orders", 3, 1234)),
    ("my.topic-v2_x:0=0", ("my.topic-v2_x", 0, 0)),
])
def test_offset_targets(text: str, expected: tuple[str, int, int]) -> None:
    """--to-offset takes TOPIC:PARTITION=OFFSET (Kafka topic names hold neither : nor =)."""
    assert offsets_cli._offset_target(text) == expected


@pytest.mark.parametrize("text", ["orders=5", "orders:x=5", "orders:1=-1", "orders:1",
                                  ":1=5", "orders:1=", "1234"])
def test_offset_target_rejects_anything_else(text: str) -> None:
    """A malformed --to-offset is a usage error showing the expected form."""
    with pytest.raises(argparse.ArgumentTypeError, match="TOPIC:PARTITION=OFFSET"):
        offsets_cli._offset_target(text)


def parse_reset(*args: str) -> argparse.Namespace:
    """`kasper offsets reset ...` parsed as the CLI does."""
    return cli._parser().parse_args(["offsets", "reset", *args, *BASE])


def test_to_offset_repeats_and_excludes_to() -> None:
    """--to-offset may repeat and reaches the reset as a list; it and --to exclude each
    other, and one of them is required (argparse exits 2)."""
    args = parse_reset("--to-offset", "t:0=5", "--to-offset", "t:1=7", "--dry-run")
    assert args.to == [("t", 0, 5), ("t", 1, 7)] and args.dry_run
    assert parse_reset("--to", "earliest").to == "earliest"
    for wrong in (["--to", "latest", "--to-offset", "t:0=5"], []):
        with pytest.raises(SystemExit) as caught:
            parse_reset(*wrong)
        assert caught.value.code == 2


ROWS = [PartitionOffsets("t", 0, 40, low=10, high=50), PartitionOffsets("t", 1, 7, 0, 9)]


def test_explicit_targets_move_only_the_named_partitions() -> None:
    """Only the partitions named move; the low and the high watermark are both valid."""
    config = config_for_reset()
    assert offsets_cli.reset_targets(config, ROWS, [("t", 1, 9)], 1.0) == {("t", 1): 9}
    assert offsets_cli.reset_targets(config, ROWS, [("t", 0, 10), ("t", 1, 0)], 1.0) == {
        ("t", 0): 10, ("t", 1): 0}


@pytest.mark.parametrize(("wanted", "message"), [
    ([("t", 0, 51)], "--to-offset t:0=51: topic 't' partition 0 holds offsets 10..50 "
                     "(low to high watermark; 50 is the end, after its last record)"),
    ([("t", 0, 9)], "--to-offset t:0=9: topic 't' partition 0 holds offsets 10..50"),
    ([("t", 2, 0)], "--to-offset t:2: not an input partition of group 'grp' "
                    "(its partitions: t:0, t:1)"),
    ([("u", 0, 0)], "--to-offset u:0: not an input partition"),
    ([("t", 1, 3), ("t", 1, 4)], "--to-offset t:1 is given twice"),
])
def test_explicit_targets_refuse_what_kafka_does_not_hold(
        wanted: list[tuple[str, int, int]], message: str) -> None:
    """An offset outside [low, high] of its partition, a partition the processor does
    not read, or one named twice: exit 2 naming topic, partition and the valid range."""
    with pytest.raises(CliError, match=re.escape(message)) as caught:
        offsets_cli.reset_targets(config_for_reset(), ROWS, wanted, 1.0)
    assert caught.value.code == cli.EXIT_USAGE


def test_describe_explicit_targets() -> None:
    """The closing line names every partition moved and its offset."""
    assert offsets_cli.describe_target([("t", 0, 5), ("t", 1, 7)]) == "t:0=5, t:1=7"
