"""How a remote store's request is retried: the one loop Redis, PostgreSQL, OpenSearch
and Cassandra share (connection failures retried with doubling backoff, then
``StoreUnavailableError``; every attempt a round trip). Each backend keeps what is its
own: which of its errors are retriable, and how its other errors are mapped."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from kasper_py.exceptions import StoreUnavailableError

__all__ = ["RetryPolicy", "with_retries"]

T = TypeVar("T")


class RetryPolicy(Protocol):
    """A table's retry settings."""

    @property
    def retries(self) -> int:
        """Attempts after the first."""

    @property
    def backoff(self) -> float:
        """Seconds before the first retry, doubled before each next one."""

    @property
    def max_backoff(self) -> float:
        """The longest wait between two attempts."""

    @property
    def timeout(self) -> float:
        """Seconds each attempt may wait (said in the error)."""


def _nothing() -> None:
    """Nothing to do before a retry."""


def with_retries(policy: RetryPolicy, request: Callable[[], T], *,
                 retriable: tuple[type[Exception], ...], where: str, what: str,
                 counted: Callable[[int], None],
                 before_retry: Callable[[], None] = _nothing) -> T:
    """Run ``request``; a ``retriable`` failure is tried again after ``policy.backoff *
    2 ** n`` seconds (at most ``max_backoff``), ``policy.retries`` times, then raises
    ``StoreUnavailableError`` ("``where`` unreachable: ``what`` failed N times ...").
    Other exceptions pass through. ``counted`` hears the attempts made (round trips);
    ``before_retry`` runs after each retriable failure (drop a broken connection)."""
    attempts = 0
    try:
        while True:
            attempts += 1
            try:
                return request()
            except retriable as exc:
                before_retry()
                if attempts > policy.retries:
                    raise StoreUnavailableError(
                        f"{where} unreachable: {what} failed {attempts} times (each waiting "
                        f"up to {policy.timeout:g}s): {exc}") from exc
                time.sleep(min(policy.max_backoff, policy.backoff * 2 ** (attempts - 1)))
    finally:
        counted(attempts)
