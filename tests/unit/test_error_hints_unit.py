"""Errors a newcomer meets first say how to fix them: a store nobody declared names
``--stores``/``stores=``; the bytes serde given a str names the str serde."""

from __future__ import annotations

import pytest

from kasper_py import BYTES, Message, MessageProcessor, Sender
from kasper_py.exceptions import ProcessingError, SerdeError, StoreError, UnknownStoreError
from kasper_py.stores.memory import MemoryTable
from kasper_py.testing import ProcessorDriver, make_message

UNDECLARED = ("no store 'counts' (declared: none): declare it where the processor runs: "
              "`kasper run ... --stores MODULE:ATTR` (a sequence of StoreSpecs, e.g. "
              "[RocksDBTable('counts')]), TopicProcessor(..., stores=[...]), or an App "
              "processor's stores=")


class Counting(MessageProcessor):
    """Reads the store "counts" (declared or not)."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        self.context.store("counts").put("n", len(messages))


class SendsText(MessageProcessor):
    """Sends a str value through the default bytes serde."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        sender.send("out", "text")


def test_an_undeclared_store_names_the_fix() -> None:
    """``context.store`` of an undeclared store: a ``ProcessingError`` (as any bug in
    ``process()``) caused by ``UnknownStoreError`` (a ``KeyError``, as it always was)
    whose text names the store, what is declared and the fix."""
    driver = ProcessorDriver(Counting)
    with pytest.raises(ProcessingError) as caught:
        driver.process([make_message("input", b"v")])
    cause = caught.value.__cause__
    assert isinstance(cause, UnknownStoreError)
    assert isinstance(cause, KeyError) and not isinstance(cause, StoreError)
    assert str(cause) == UNDECLARED


def test_the_declared_stores_are_listed() -> None:
    """With other stores declared, they are listed by name."""
    driver = ProcessorDriver(Counting, stores=[MemoryTable("totals"), MemoryTable("seen")])
    with pytest.raises(ProcessingError) as caught:
        driver.process([make_message("input", b"v")])
    assert str(caught.value.__cause__).startswith(
        "no store 'counts' (declared: 'seen', 'totals'): declare it")


def test_the_bytes_serde_suggests_str_for_text() -> None:
    """A str given to the bytes serde: the message suggests the str serde; another type
    does not (it is not text)."""
    with pytest.raises(SerdeError) as caught:
        BYTES.encode("alice")
    assert str(caught.value) == (
        'bytes serde cannot encode str; pass bytes or declare the str serde '
        '(value_serde="str" or key_serde="str", in Config, a table or the DSL)')
    with pytest.raises(SerdeError) as caught:
        BYTES.encode(42)
    assert str(caught.value) == "bytes serde cannot encode int; pass bytes"
    driver = ProcessorDriver(SendsText)
    with pytest.raises(SerdeError) as caught:
        driver.process([make_message("input", b"v")])
    assert str(caught.value) == (
        "cannot encode message for topic 'out': bytes serde cannot encode str; pass bytes "
        'or declare the str serde (value_serde="str" or key_serde="str", in Config, a '
        "table or the DSL) [batch not committed: input[0] offsets 0..0]")
