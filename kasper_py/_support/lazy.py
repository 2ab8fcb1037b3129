"""Package facades whose public names are imported on first use (a module
``__getattr__``, PEP 562): ``kasper_py`` itself.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping

__all__ = ["lazy_names"]


def lazy_names(package: str, homes: Mapping[str, str], public: Iterable[str]
               ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: ``homes`` maps each module to
    the names (space-separated) imported from it on first use, then kept on the
    package; ``public`` is its ``__all__``."""
    module_of = {name: module for module, names in homes.items() for name in names.split()}
    listed = list(public)

    def get(name: str) -> object:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def names() -> list[str]:
        return sorted({*vars(sys.modules[package]), *listed})

    return get, names
