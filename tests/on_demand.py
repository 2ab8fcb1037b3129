"""Servers of the local stack started when a test needs one that is not running, so a
single test file runs after `make demo` (Kafka alone) as it does after `make test`."""

from __future__ import annotations

from collections.abc import Callable

import pytest


def on_demand(component: str, address: str, answers: Callable[[], object], *,
              external: bool) -> None:
    """Return once ``component`` at ``address`` answers (``answers()`` raises while it
    does not). A local stack component that does not is started first, as `kasper stack
    up` would, and left running like `make test`'s; an ``external`` server (one named
    by an environment variable) is never started. Fails (not skips) otherwise."""
    try:
        answers()
        return
    except Exception as exc:
        if external:
            pytest.fail(f"no {component} at {address} ({exc})")
    from kasper_py import stack

    try:
        stack.up([component])
        answers()
    except Exception as exc:
        pytest.fail(f"no {component} at {address}, and `kasper stack up {component}` "
                    f"did not start one: {exc}")
