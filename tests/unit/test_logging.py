"""configure_logging: JSON lines by default, console on a terminal, secrets masked,
and nothing configured by merely importing kasper_py."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

import pytest
import structlog

from kasper_py import Config
from kasper_py.observability.logging import MASK, configure_logging

SECRET = "hunter2-do-not-print"


class TtyStream(io.StringIO):
    """A StringIO that says it is a terminal."""

    def isatty(self) -> bool:
        return True



def lines(stream: io.StringIO) -> list[dict[str, object]]:
    """The JSON objects written to ``stream``, one per line."""
    return [json.loads(line) for line in stream.getvalue().splitlines() if line]


def test_json_by_default_off_a_terminal() -> None:
    """Not a terminal: one JSON object per line with timestamp, level, event and fields."""
    stream = io.StringIO()
    configure_logging(stream=stream)
    structlog.get_logger("t").info("kasper.batch", processor="p", partition=3, consumed=7)
    [line] = lines(stream)
    assert line["event"] == "kasper.batch" and line["level"] == "info"
    assert line["processor"] == "p" and line["partition"] == 3 and line["consumed"] == 7
    assert str(line["timestamp"]).endswith("Z")


def test_console_on_a_terminal() -> None:
    """On a terminal the console renderer is used (not JSON)."""
    stream = TtyStream()
    configure_logging(stream=stream)
    structlog.get_logger("t").info("kasper.started", processor="p")
    text = stream.getvalue()
    assert "kasper.started" in text and "processor" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_json_can_be_forced_on_a_terminal() -> None:
    """json=True overrides the terminal check."""
    stream = TtyStream()
    configure_logging(json=True, stream=stream)
    structlog.get_logger("t").info("x")
    assert lines(stream)[0]["event"] == "x"


def test_level_filters_lower_levels() -> None:
    """At WARNING, info lines are dropped."""
    stream = io.StringIO()
    configure_logging(level="warning", stream=stream)
    log = structlog.get_logger("t")
    log.info("dropped")
    log.warning("kept")
    assert [line["event"] for line in lines(stream)] == ["kept"]


def test_unknown_level_is_an_error() -> None:
    """A misspelt level fails loudly instead of logging everything."""
    with pytest.raises(ValueError, match="unknown log level"):
        configure_logging(level="LOUD", stream=io.StringIO())


def test_secrets_never_reach_the_output() -> None:
    """Secret-named keys, nested override mappings, key=value text and a Config are masked."""
    stream = io.StringIO()
    configure_logging(stream=stream)
    config = Config(name="p", bootstrap_servers="b:9092", input_topics=["t"],
                    client_overrides={"sasl.password": SECRET, "sasl.username": "me"},
                    producer_overrides={"ssl.key.password": SECRET})
    log = structlog.get_logger("t")
    log.info("e1", password=SECRET, overrides={"sasl.password": SECRET, "retries": 3})
    log.info("e2", error=f"auth failed for sasl.password={SECRET}, retrying")
    log.info("e3", config=config, text=repr(config))
    output = stream.getvalue()
    assert SECRET not in output
    first = lines(stream)[0]
    assert first["password"] == MASK
    assert first["overrides"] == {"sasl.password": MASK, "retries": 3}
    assert "sasl.username" in output and "me" in output


def test_config_repr_masks_secrets() -> None:
    """Config's repr shows secret keys but never their values."""
    config = Config(name="p", bootstrap_servers="b:9092", input_topics=["t"],
                    client_overrides={"sasl.password": SECRET, "ssl.key.pem": SECRET})
    text = repr(config)
    assert SECRET not in text
    assert "sasl.password" in text and "ssl.key.pem" in text


def test_exceptions_are_structured_without_locals() -> None:
    """A logged exception is a dict with its type and frames, but no local variables
    (they could hold secrets)."""
    stream = io.StringIO()
    configure_logging(stream=stream)
    password = SECRET  # a local that must not be printed
    try:
        raise RuntimeError("store unreachable")
    except RuntimeError:
        structlog.get_logger("t").exception("kasper.failed", length=len(password))
    [line] = lines(stream)
    [exception] = line["exception"]  # type: ignore[misc]
    assert exception["exc_type"] == "RuntimeError"
    assert SECRET not in stream.getvalue()


def test_standard_logging_is_rendered_the_same_way() -> None:
    """Records of client libraries using ``logging`` come out as the same JSON lines."""
    stream = io.StringIO()
    configure_logging(stream=stream)
    logging.getLogger("cassandra.cluster").warning("host %s down, password=%s", "h1", SECRET)
    [line] = lines(stream)
    assert line["logger"] == "cassandra.cluster" and line["level"] == "warning"
    assert "host h1 down" in str(line["event"]) and SECRET not in stream.getvalue()


def test_reconfiguring_does_not_stack_handlers() -> None:
    """Calling configure_logging twice leaves one kasper handler on the root logger."""
    configure_logging(stream=io.StringIO())
    stream = io.StringIO()
    configure_logging(stream=stream)
    logging.getLogger("x").warning("once")
    assert len(lines(stream)) == 1


def test_importing_kasper_py_configures_nothing() -> None:
    """The library never configures logging on import, the CLI module included."""
    code = ("import logging, structlog, kasper_py, kasper_py.observability.logging, "
            "kasper_py.cli, kasper_py.observability.metrics; "
            "print(structlog.is_configured(), logging.getLogger().handlers)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False []"


def test_a_saved_exc_info_is_rendered_outside_its_except_block() -> None:
    """A stdlib record logged later with a saved exception (asyncio does this) keeps
    its traceback: masking leaves exc_info alone."""
    stream = io.StringIO()
    configure_logging(stream=stream)
    try:
        raise KeyError("lost-partition")
    except KeyError as exc:
        saved = exc
    logging.getLogger("asyncio").error("task failed", exc_info=saved)
    [line] = lines(stream)
    [exception] = line["exception"]  # type: ignore[misc]
    assert exception["exc_type"] == "KeyError" and "lost-partition" in exception["exc_value"]


class RecordingStream(io.StringIO):
    """A stream that keeps every write, as the pipe under it would see them."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def test_each_log_line_is_one_write() -> None:
    """Workers of `kasper run --processes N` share one stderr: each JSON line must reach
    it in a single write, newline included, or lines of two workers interleave."""
    stream = RecordingStream()
    configure_logging(json=True, stream=stream)
    structlog.get_logger("kasper_py").info("kasper.batch", partition=3, consumed=100)
    logging.getLogger("kasper_py.stdlib").warning("from the standard library")
    assert len(stream.writes) == 2
    assert all(w.endswith("\n") and w.count("\n") == 1 for w in stream.writes)
    assert json.loads(stream.writes[0])["event"] == "kasper.batch"
