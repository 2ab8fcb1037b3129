"""Tracing from `kasper run` into a real backend: the stack's Jaeger v2 (started on demand,
as `kasper stack up jaeger` does) receives the turns' spans over OTLP/HTTP, with tracing
turned on by flags, by the OpenTelemetry variables or by the TOML file. Each output
record's ``traceparent`` names its turn's span; that trace is read back by its id from
Jaeger's query API (v3) and must hold the turn and its four step spans. Bad settings
are refused before anything runs. operations.md's own-provider snippet runs as written."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from docsite.blocks import ROOT, blocks
from kasper_py import stack

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

# the first test to need Jaeger may build it with Go (minutes, more on a loaded machine)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

HERE = Path(__file__).parent
STEPS = ["kasper.commit", "kasper.flush", "kasper.process", "kasper.produce"]
RECORDS = [(b"k%d" % n, b"v%d" % n) for n in range(5)]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/services", timeout=2) as reply:
            return int(reply.status) == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def jaeger() -> tuple[str, str]:
    """(query API URL, OTLP/HTTP endpoint) of the stack's Jaeger, started here when it is
    not running (built once from the Go module proxy; minutes the first time)."""
    if not _answers(stack.jaeger_url()):
        stack.up(["jaeger"])
    return stack.jaeger_url(), stack.jaeger_otlp_endpoint()


def kasper_env(bootstrap: str, output: str, **extra: str) -> dict[str, str]:
    """The environment of a run: the broker and the example's output topic, and no
    ``KASPER_*`` or ``OTEL_*`` variable of the test runner's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KASPER_", "OTEL_"))}
    env.update(KASPER_BOOTSTRAP_SERVERS=bootstrap, EXAMPLE_OUTPUT_TOPIC=output, **extra)
    return env


def kasper_run(name: str, source: str, env: dict[str, str], *flags: str
               ) -> subprocess.CompletedProcess[str]:
    """`kasper run --until-caught-up` of examples_module's upper-caser over ``source``."""
    command = [sys.executable, "-m", "kasper_py", "run", "examples_module:factory",
               "--stores", "examples_module:stores", "--app-dir", str(HERE), "--name", name,
               "--input-topics", source, "--batch-wait", "0.2", "--until-caught-up",
               "--log-format", "json", *flags]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120,
                          check=False)


def turns_of_outputs(kafka: Any, output: str) -> set[tuple[str, str]]:
    """(trace id, span id) of each turn the outputs' ``traceparent`` names (one, unless
    the first fetch split the five records), every output carrying one."""
    messages = kafka.read_all(output)
    assert sorted(m.value() for m in messages) == [v.upper() for _, v in RECORDS]
    parents = {dict(m.headers() or [])["traceparent"].decode() for m in messages}
    return {(trace_id, span_id) for _version, trace_id, span_id, _flags
            in (parent.split("-") for parent in parents)}


def assert_traced(url: str, kafka: Any, output: str, service: str) -> None:
    """Each turn that made the outputs is a trace in Jaeger, found by its id, of
    ``service``: the turn's span, a root, and its four step spans."""
    for trace_id, turn_id in turns_of_outputs(kafka, output):
        services, spans = fetch_trace(url, trace_id)
        assert services == {service}
        assert_turn_with_steps(spans, trace_id, turn_id)


def fetch_trace(url: str, trace_id: str, spans: int = 5, timeout: float = 30.0
                ) -> tuple[set[str], list[dict[str, Any]]]:
    """The service names and spans of trace ``trace_id`` (GET /api/v3/traces/ID), once it
    holds ``spans`` spans: the exporter sends in batches, Jaeger stores in batches."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/v3/traces/{trace_id}", timeout=5) as reply:
                found = json.loads(reply.read())["result"]["resourceSpans"]
        except urllib.error.HTTPError as exc:
            assert exc.code == 404 and time.monotonic() < deadline, \
                f"trace {trace_id} not in Jaeger: {exc}"
            found = []
        services = {attribute["value"]["stringValue"] for resource in found
                    for attribute in resource["resource"]["attributes"]
                    if attribute["key"] == "service.name"}
        listed = [span for resource in found for scope in resource["scopeSpans"]
                  for span in scope["spans"]]
        if len(listed) >= spans:
            return services, listed
        assert time.monotonic() < deadline, f"trace {trace_id}: {len(listed)} spans only"
        time.sleep(0.5)


def assert_turn_with_steps(spans: list[dict[str, Any]], trace_id: str, turn_id: str) -> None:
    """One ``kasper.turn`` span, ``turn_id``, a root; the four step spans its children."""
    assert all(span["traceId"] == trace_id for span in spans)
    turn = [span for span in spans if span["name"] == "kasper.turn"]
    assert [span["spanId"] for span in turn] == [turn_id]
    assert not turn[0].get("parentSpanId")
    attributes = {a["key"]: a["value"] for a in turn[0]["attributes"]}
    assert attributes["messaging.system"] == {"stringValue": "kafka"}
    children = sorted((span["name"], span.get("parentSpanId")) for span in spans
                      if span["name"] != "kasper.turn")
    assert children == [(step, turn_id) for step in STEPS]


@pytest.fixture
def topics(new_topic: Callable[..., str], kafka: Any) -> tuple[str, str]:
    """A fresh input topic holding ``RECORDS``, and a fresh output topic."""
    source, output = new_topic("traced-in"), new_topic("traced-out")
    kafka.produce(source, RECORDS)
    return source, output


def test_run_with_tracing_flags_exports_turns_to_jaeger(
        bootstrap: str, topics: tuple[str, str], kafka: Any,
        unique_name: Callable[[str], str], jaeger: tuple[str, str]) -> None:
    """`kasper run --tracing otlp --otlp-endpoint URL`: the turn that upper-cased the
    five records is in Jaeger under the processor's name, with its four step spans."""
    url, endpoint = jaeger
    source, output = topics
    name = unique_name("traced-flags")
    run = kasper_run(name, source, kasper_env(bootstrap, output),
                     "--tracing", "otlp", "--otlp-endpoint", endpoint)
    assert run.returncode == 0, run.stderr
    assert_traced(url, kafka, output, name)
    assert kafka.committed(name, source) == {0: len(RECORDS)}


def test_run_with_opentelemetry_variables(
        bootstrap: str, topics: tuple[str, str], kafka: Any,
        unique_name: Callable[[str], str], jaeger: tuple[str, str]) -> None:
    """No kasper setting: OTEL_TRACES_EXPORTER=otlp turns tracing on,
    OTEL_EXPORTER_OTLP_ENDPOINT names Jaeger and OTEL_SERVICE_NAME the service."""
    url, endpoint = jaeger
    source, output = topics
    service = unique_name("traced-service")
    env = kasper_env(bootstrap, output, OTEL_TRACES_EXPORTER="otlp",
                     OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_SERVICE_NAME=service)
    run = kasper_run(unique_name("traced-env"), source, env)
    assert run.returncode == 0, run.stderr
    assert_traced(url, kafka, output, service)


def test_run_with_tracing_in_the_config_file(  # noqa: PLR0917 - fixtures
        bootstrap: str, topics: tuple[str, str], kafka: Any,
        unique_name: Callable[[str], str], jaeger: tuple[str, str], tmp_path: Path) -> None:
    """``tracing = "otlp"`` and ``otlp_endpoint`` in kasper.toml; KASPER_TRACING=none
    the file wins over OTEL_TRACES_EXPORTER=none."""
    url, endpoint = jaeger
    source, output = topics
    name = unique_name("traced-toml")
    config = tmp_path / "kasper.toml"
    config.write_text(f'tracing = "otlp"\notlp_endpoint = "{endpoint}"\n')
    env = kasper_env(bootstrap, output, OTEL_TRACES_EXPORTER="none")
    run = kasper_run(name, source, env, "--config", str(config))
    assert run.returncode == 0, run.stderr
    assert_traced(url, kafka, output, name)


def test_run_without_tracing_adds_no_traceparent(
        bootstrap: str, topics: tuple[str, str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """``tracing = "otlp"`` in the file, KASPER_TRACING=none in the environment: the
    variable wins, and the outputs carry no ``traceparent``."""
    source, output = topics
    config = tmp_path / "kasper.toml"
    config.write_text('tracing = "otlp"\n')
    env = kasper_env(bootstrap, output, KASPER_TRACING="none", OTEL_TRACES_EXPORTER="otlp")
    run = kasper_run(unique_name("untraced"), source, env, "--config", str(config))
    assert run.returncode == 0, run.stderr
    assert [m.headers() for m in kafka.read_all(output)] == [None] * len(RECORDS)


def test_unreachable_collector_fails_no_turn(
        bootstrap: str, topics: tuple[str, str], kafka: Any,
        unique_name: Callable[[str], str]) -> None:
    """Nothing listens at ``--otlp-endpoint``: the run still processes and commits every
    record and exits 0; the SDK logs the failed export."""
    source, output = topics
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    name = unique_name("traced-nowhere")
    run = kasper_run(name, source, kasper_env(bootstrap, output),
                     "--tracing", "otlp", "--otlp-endpoint", closed)
    assert run.returncode == 0, run.stderr
    assert len(turns_of_outputs(kafka, output)) >= 1
    assert kafka.committed(name, source) == {0: len(RECORDS)}
    assert "Failed to export span" in run.stderr


@pytest.mark.parametrize(("flags", "extra_env", "message"), [
    ([], {"KASPER_TRACING": "zipkin"},
     "kasper: error: config field 'tracing': must be one of none, otlp, console, got "
     "'zipkin' (from environment)"),
    (["--tracing", "otlp", "--otlp-endpoint", "127.0.0.1:4318"], {},
     "kasper: error: config field 'otlp_endpoint': must be an http(s) URL, got "
     "'127.0.0.1:4318' (from flags)"),
    ([], {"OTEL_TRACES_EXPORTER": "jaeger"},
     "kasper: error: config field 'tracing': must be one of none, otlp, console, got "
     "'jaeger' (from OTEL_TRACES_EXPORTER)"),
    (["--tracing", "otlp"], {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
     "kasper: error: config field 'tracing': OTEL_EXPORTER_OTLP_PROTOCOL='grpc': kasper_py "
     "exports over OTLP/HTTP (http/protobuf); unset it and point otlp_endpoint at the "
     "collector's HTTP port (4318 by default)"),
])
def test_bad_tracing_settings_are_refused(  # noqa: PLR0917 - fixtures
        bootstrap: str, topics: tuple[str, str], kafka: Any,
        unique_name: Callable[[str], str], flags: list[str], extra_env: dict[str, str],
        message: str) -> None:
    """A bad exporter, endpoint or protocol: exit 3 with the field and where it came
    from, and nothing processed (no offset committed)."""
    source, output = topics
    name = unique_name("badtrace")
    run = kasper_run(name, source, kasper_env(bootstrap, output, **extra_env), *flags)
    assert (run.returncode, run.stderr.strip().splitlines()[-1]) == (3, message)
    assert kafka.committed(name, source) == {0: None}


def test_an_unknown_tracing_flag_lists_the_choices(bootstrap: str, topics: tuple[str, str],
                                                    unique_name: Callable[[str], str]) -> None:
    """``--tracing zipkin``: a usage error (exit 2) that lists what ``--tracing`` takes."""
    source, output = topics
    run = kasper_run(unique_name("badflag"), source, kasper_env(bootstrap, output),
                     "--tracing", "zipkin")
    assert (run.returncode, run.stderr.strip().splitlines()[-1]) == (
        2, "kasper run: error: argument --tracing: invalid choice: 'zipkin' (choose from "
        "'none', 'otlp', 'console')")


DOC_PRELUDE = '''
import os
from kasper_py import Config, MessageProcessor, TopicProcessor


class Upper(MessageProcessor):
    def __init__(self, context):
        pass

    def process(self, messages, sender):
        for message in messages:
            sender.send(os.environ["EXAMPLE_OUTPUT_TOPIC"], message.value.upper())


config = Config(name=os.environ["DOC_NAME"], bootstrap_servers=os.environ["DOC_BOOTSTRAP"],
                input_topics=[os.environ["DOC_SOURCE"]], batch_wait=0.2)
factory = Upper
'''


def test_operations_snippet_runs_as_written(  # noqa: PLR0917 - fixtures
        bootstrap: str, topics: tuple[str, str], kafka: Any,
        unique_name: Callable[[str], str], jaeger: tuple[str, str], tmp_path: Path) -> None:
    """docs/operations.md's own-provider block, run verbatim (after a prelude defining
    ``config`` and ``factory``) with the exporter's standard variable pointing at Jaeger:
    SIGTERM closes the loop, ``provider.shutdown()`` exports, the turn is in Jaeger."""
    url, endpoint = jaeger
    (snippet,) = [b.code for b in blocks(ROOT / "docs" / "operations.md")
                  if b.lang == "python" and "OTLPSpanExporter" in b.code]
    script = tmp_path / "traced.py"
    script.write_text(DOC_PRELUDE + snippet)
    source, output = topics
    name = unique_name("traced-doc")
    env = kasper_env(bootstrap, output, DOC_NAME=name, DOC_BOOTSTRAP=bootstrap,
                     DOC_SOURCE=source, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
                     PYTHONPATH=str(ROOT))
    process = subprocess.Popen([sys.executable, str(script)], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while kafka.committed(name, source) != {0: len(RECORDS)}:
            assert process.poll() is None and time.monotonic() < deadline, \
                process.communicate(timeout=5)[0] if process.poll() is not None else "slow"
            time.sleep(0.5)
    finally:
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    assert_traced(url, kafka, output, name)
