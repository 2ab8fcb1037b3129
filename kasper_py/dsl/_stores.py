"""Where the DSL's tables and aggregations keep their state: the ``stores=`` of a
``Builder`` turned into the one function the graph asks for each store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from kasper_py.exceptions import ConfigError
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.memory import MemoryTable
from kasper_py.stores.ttl import Ttl

__all__ = ["StoreKind", "StoreMaker", "store_maker"]

StoreKind = Literal["rocksdb", "memory"] | Callable[[str, bool], StoreSpec]
"""Where tables and aggregations keep their state: ``"rocksdb"`` (a changelog-backed
``RocksDBTable``, the default), ``"memory"`` (``MemoryTable``: tests), or a function of
(store name, windowed) returning a ``StoreSpec``."""

StoreMaker = Callable[[str, bool, "float | Ttl | None"], StoreSpec]
"""(store name, windowed, ttl) to the store's ``StoreSpec``."""


def store_maker(kind: StoreKind) -> StoreMaker:
    """The maker of ``kind``'s stores. A ``ttl`` (an operator's ``ttl=``) reaches the
    built-in kinds' tables; a function given as ``stores=`` makes its own stores, so it
    gives them their ttl itself, and an operator's ``ttl=`` with it is a ``ConfigError``."""
    if kind == "rocksdb":
        return _rocksdb
    if kind == "memory":
        return _memory
    if not callable(kind):
        raise ConfigError("dsl", f"stores= must be 'rocksdb', 'memory' or a function of "
                          f"(name, windowed), got {kind!r}")
    own = kind

    def made_by_the_user(name: str, windowed: bool, ttl: float | Ttl | None) -> StoreSpec:
        if ttl is not None:
            raise ConfigError("dsl", f"store {name!r}: ttl= takes the builder's own stores "
                              "('rocksdb' or 'memory'); with a stores= function, give the "
                              "table its ttl in that function")
        return own(name, windowed)

    return made_by_the_user


def _rocksdb(name: str, windowed: bool, ttl: float | Ttl | None) -> StoreSpec:
    from kasper_py.stores.rocksdb import RocksDBTable  # noqa: PLC0415 - the rocksdb extra

    if windowed:
        return RocksDBTable(name, key_serde="bytes", value_serde="bytes")
    return RocksDBTable(name, key_serde="json", value_serde="json", ttl=ttl)


def _memory(name: str, _windowed: bool, ttl: float | Ttl | None) -> StoreSpec:
    return MemoryTable(name, ttl=ttl)
