"""An ``ArrowMessageProcessor`` for the columnar CLI test: for each JSON event
``{"user": ..., "amount": n}`` it sends ``{"offset": ..., "doubled": 2n}`` keyed by user
to ``$ARROW_OUTPUT_TOPIC``, computed on the batch's columns; a negative amount raises.

    kasper run arrow_module:Doubler --app-dir tests/integration --config kasper.toml
"""

from __future__ import annotations

import json
import os
from typing import Any

import pyarrow.compute as pc

from kasper_py import Sender
from kasper_py.arrow import ArrowMessageProcessor, send_table


class Doubler(ArrowMessageProcessor):
    """Doubles the ``amount`` column; refuses a batch with a negative amount. Its table
    has the one message column it reads, ``offset``, beside the values'."""

    message_columns = ("offset",)

    def process_table(self, table: Any, sender: Sender) -> None:
        if pc.any(pc.less(table.column("amount"), 0)).as_py():
            raise ValueError("negative amount")
        doubled = table.select(["user", "offset"]).append_column(
            "doubled", pc.multiply(table.column("amount"), 2))
        send_table(sender, os.environ["ARROW_OUTPUT_TOPIC"], doubled, key="user")


class BytesDoubler(ArrowMessageProcessor):
    """For ``value_serde = "bytes"`` (values parsed by Arrow's JSON reader; on Spark the
    records stay columnar): the same output as ``Doubler``, encoded here as JSON bytes."""

    def process_table(self, table: Any, sender: Sender) -> None:
        rows = table.select(["user", "offset", "amount"]).to_pylist()
        sender.send_many(os.environ["ARROW_OUTPUT_TOPIC"], [
            (row["user"], json.dumps({"offset": row["offset"], "doubled": 2 * row["amount"]},
                                     separators=(",", ":")).encode(), None, None)
            for row in rows])
