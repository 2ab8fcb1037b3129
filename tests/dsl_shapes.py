"""Every DSL shape with a multi-input stage or a repartition, each built by a
``Builder("shapes")`` so a test can run it under another ``Config.name`` (``kasper run
--name``) and check that no stage loses records read from a topic named after it.
Tables are RocksDB (kept between runs) unless ``stores`` says otherwise; keys and
values are JSON (``KASPER_KEY_SERDE=json``, ``KASPER_VALUE_SERDE=json``)."""

from __future__ import annotations

from typing import Any

from kasper_py.app import App
from kasper_py.dsl import Builder
from kasper_py.dsl.builder import StoreKind
from kasper_py.windows import JoinWindows

BUILDER = "shapes"


def one_input(clicks: str, out: str, stores: StoreKind = "rocksdb") -> App:
    """One input: clicks counted per user (through a repartition)."""
    b = Builder(BUILDER, stores=stores)
    (b.stream(clicks).group_by(lambda _k, v: v["user"]).count("per-user")
        .to_stream().to(out))
    return b.build()


def stream_table(clicks: str, users: str, out: str, stores: StoreKind = "rocksdb") -> App:
    """A stream re-keyed by user and joined to the users table: the join's stage reads
    its repartition and the users topic."""
    b = Builder(BUILDER, stores=stores)
    table = b.table(users)
    (b.stream(clicks).select_key(lambda _k, v: v["user"])
        .join(table, lambda click, user: {"page": click["page"], "name": user["name"]})
        .to(out))
    return b.build()


def table_table(clicks: str, users: str, out: str, stores: StoreKind = "rocksdb") -> App:
    """A count per user (a table of the repartition's stage) joined with the users
    table: one stage reading the repartition and the users topic."""
    b = Builder(BUILDER, stores=stores)
    counts = b.stream(clicks).group_by(lambda _k, v: v["user"]).count("per-user")
    counts.join(b.table(users), lambda n, user: {"name": user["name"], "clicks": n}
                ).to_stream().to(out)
    return b.build()


def table_outer(clicks: str, users: str, out: str, stores: StoreKind = "rocksdb") -> App:
    """A count per user outer-joined with the users table: every user of either side,
    with the name and the count it has (``None`` for the other)."""
    b = Builder(BUILDER, stores=stores)
    counts = b.stream(clicks).group_by(lambda _k, v: v["user"]).count("per-user")
    counts.outer_join(b.table(users), lambda n, user: {
        "name": user and user["name"], "clicks": n}).to_stream().to(out)
    return b.build()


def window_join(orders: str, payments: str, out: str, stores: StoreKind = "rocksdb", *,
                grace: float = 0) -> App:
    """Orders outer-joined with their payments (both keyed by order id) within 0.5 s
    and ``grace`` s, both sides kept in the windowed store ``paid``: ``{"order": amount,
    "paid": amount}`` for a payment in time, and a side alone (the other ``None``) once
    its window closed."""
    b = Builder(BUILDER, stores=stores)
    (b.stream(orders).outer_join(b.stream(payments), _order_paid, JoinWindows(0.5, grace=grace),
                                 store="paid", name="order-paid")
        .to(out))
    return b.build()


def foreign_key(orders: str, users: str, out: str, stores: StoreKind = "rocksdb") -> App:
    """Orders joined with the user each names (KIP-213): two repartitions, each read
    by a stage that reads a source topic too."""
    b = Builder(BUILDER, stores=stores)
    (b.table(orders).join_foreign(b.table(users), lambda order: order["user"],
                                  _order_with_name, name="orders-named")
        .to_stream().to(out))
    return b.build()


def merge(clicks: str, views: str, out: str, stores: StoreKind = "rocksdb") -> App:
    """Clicks re-keyed by page through a repartition, merged with page views read
    straight from their topic: one stage of two inputs."""
    b = Builder(BUILDER, stores=stores)
    by_page = b.stream(clicks).select_key(lambda _k, v: v["page"]).through("by-page")
    by_page.merge(b.stream(views)).map_values(lambda v: v["user"]).to(out)
    return b.build()


def _order_paid(order: dict[str, Any] | None, payment: dict[str, Any] | None
                ) -> dict[str, Any]:
    return {"order": order and order["amount"], "paid": payment and payment["amount"]}


def _order_with_name(order: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    return {"amount": order["amount"], "name": user["name"]}
