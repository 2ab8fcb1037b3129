"""The public API is exactly what __all__ says, and every name in it exists."""

from __future__ import annotations

import kasper_py


def test_all_names_exist() -> None:
    """Every name in __all__ is importable from the package."""
    for name in kasper_py.__all__:
        assert hasattr(kasper_py, name), name


def test_public_names_are_exported() -> None:
    """No public name defined on the package is missing from __all__."""
    public = {n for n in dir(kasper_py) if not n.startswith("_")}
    modules = {n for n in public if type(getattr(kasper_py, n)).__name__ == "module"}
    assert public - modules == set(kasper_py.__all__)
