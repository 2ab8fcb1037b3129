"""Secrets given to `kasper` never come back out: a distinct value in every sensitive
librdkafka property, from the TOML file and from the environment, is looked for in
everything a user or an operator sees of a DEBUG run, the operating commands, and the
errors of a refused setting and an unreachable broker."""

from __future__ import annotations

import signal
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_cli import cli_env, kasper, kasper_command, run_args, wait_for

from kasper_py._support.ports import free_ports as free_port
from kasper_py._support.secrets import SENSITIVE_PROPERTIES

pytestmark = pytest.mark.integration

NOT_SETTABLE = {"ssl_key"}  # librdkafka refuses to take it from configuration
ENV_FIELDS = ("CLIENT", "CONSUMER", "PRODUCER")


def secrets() -> dict[str, str]:
    """A distinct, recognisable value for every settable sensitive property."""
    run = uuid.uuid4().hex[:8]
    return {key: f"sEcReT{index:02d}-{run}" for index, key in
            enumerate(k for k in SENSITIVE_PROPERTIES if k not in NOT_SETTABLE)}


def split(values: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Every other property through the environment (names without '_' only), the rest
    through the TOML file."""
    env, toml = {}, {}
    for index, (key, value) in enumerate(values.items()):
        if index % 2 and "_" not in key:
            field = ENV_FIELDS[index % 3]
            env[f"KASPER_{field}__{key.upper().replace('.', '_')}"] = value
        else:
            toml[key] = value
    return env, toml


def write_config(tmp_path: Path, name: str, topic: str, toml: dict[str, str],
                 **fields: Any) -> str:
    """A kasper.toml with the secrets spread over the three override tables."""
    lines = [f'name = "{name}"', f'input_topics = ["{topic}"]', "batch_wait = 0.3"]
    lines += [f"{key} = {value!r}" if isinstance(value, int) else f'{key} = "{value}"'
              for key, value in fields.items()]
    tables: dict[str, list[str]] = {"client_overrides": [], "consumer_overrides": [],
                                    "producer_overrides": []}
    for index, (key, value) in enumerate(toml.items()):
        tables[list(tables)[index % 3]].append(f'"{key}" = "{value}"')
    for table, entries in tables.items():
        lines += [f"[{table}]", *entries]
    path = tmp_path / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)



def fetch(url: str) -> str:
    """Status line and body of a GET, 4xx/5xx included."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return f"{response.status} {response.read().decode()}"
    except urllib.error.HTTPError as error:
        return f"{error.code} {error.read().decode()}"


def assert_hidden(values: dict[str, str], seen: dict[str, str]) -> None:
    """No secret appears in any of the texts; names where one did."""
    leaks = [(where, key) for where, text in seen.items()
             for key, value in values.items() if value in text]
    assert not leaks, f"secrets printed: {leaks}"


def test_no_secret_in_a_debug_run_metrics_health_and_tools(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """`kasper run --log-level DEBUG` (with librdkafka's configuration dump on), its
    /metrics and /health, `offsets show` and `lag` print none of the secrets, while the
    run does its work."""
    values = secrets()
    env_secrets, toml_secrets = split(values)
    assert env_secrets and toml_secrets
    source, sink = new_topic("sec-in"), new_topic("sec-out")
    kafka.produce(source, [f"m{i}".encode() for i in range(20)])
    name, port = unique_name("sec-run"), free_port()
    config = write_config(tmp_path, name, source, toml_secrets, metrics_port=port)
    env = {**cli_env(bootstrap, sink), **env_secrets,
           "KASPER_CLIENT__DEBUG": "conf,security,broker"}
    log_path = tmp_path / "run.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [*kasper_command(), *run_args(config, "--log-level", "DEBUG",
                                          "--metrics-host", "127.0.0.1")],
            stdout=log, stderr=subprocess.STDOUT, env=env)
    seen: dict[str, str] = {}
    try:
        wait_for(lambda: kafka.committed(name, source)[0] == 20, "the input to be committed")
        for path in ("/metrics", "/health/live", "/health/ready"):
            seen[path] = fetch(f"http://127.0.0.1:{port}{path}")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    seen["run output"] = log_path.read_text()
    assert "kasper.run" in seen["run output"]
    assert "kasper_messages_consumed_total" in seen["/metrics"]
    for command in (("offsets", "show"), ("lag",)):
        result = kasper(*command, "-c", config, env=env)
        assert result.returncode == 0, result.stderr
        seen[" ".join(command)] = result.stdout + result.stderr
    assert_hidden(values, seen)


def test_no_secret_in_the_errors_of_a_refused_setting_or_an_unreachable_broker(
        bootstrap: str, new_topic: Callable[..., str],
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """A setting librdkafka refuses and a broker nobody answers on both fail with an
    error that names the problem, not the secrets."""
    values = secrets()
    env_secrets, toml_secrets = split(values)
    source = new_topic("sec-err")
    refused = {**toml_secrets, "ssl_key": values["sasl.password"] + "-internal"}
    config = write_config(tmp_path, unique_name("sec-refused"), source, refused)
    env = {**cli_env(bootstrap), **env_secrets}
    seen: dict[str, str] = {}
    result = kasper(*run_args(config, "--log-level", "DEBUG"), env=env)
    assert result.returncode == 3 and "ssl_key" in result.stderr, result.stderr
    seen["refused"] = result.stdout + result.stderr

    config = write_config(tmp_path, unique_name("sec-down"), source, toml_secrets)
    down = {**env, "KASPER_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"}
    for command in (run_args(config, "--log-level", "DEBUG"), ["offsets", "show", "-c", config],
                    ["lag", "-c", config]):
        result = kasper(*command, "--connect-timeout", "2", env=down)
        assert result.returncode == 4 and "cannot reach Kafka" in result.stderr, result.stderr
        seen[command[0]] = result.stdout + result.stderr
    assert_hidden({**values, "ssl_key": refused["ssl_key"]}, seen)
