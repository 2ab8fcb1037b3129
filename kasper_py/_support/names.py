"""Resolving ``module:attribute`` names to the objects they name: the one importer of a
user's code given by name (the CLI's targets and stores, ``Config.timestamp_extractor``).
Callers word the error for their own setting.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["NameResolutionError", "resolve_name"]


class NameResolutionError(LookupError):
    """``resolve_name`` could not import the module or find the attribute."""

    def __init__(self, problem: str, missing_module: str | None = None) -> None:
        super().__init__(problem)
        self.missing_module = missing_module
        """The module that was not found, when that was the problem."""


def resolve_name(spec: str) -> Any:
    """Import ``module:attr`` (``attr`` may be dotted) and return the attribute; the
    caller has checked the shape. Raises ``NameResolutionError`` saying what failed."""
    module_name, _, attr = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise NameResolutionError(f"no module named {exc.name!r}", exc.name) from None
    except Exception as exc:
        raise NameResolutionError(f"importing {module_name!r} raised "
                                  f"{type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise NameResolutionError(f"{module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    return target
