"""``kafka/`` is the bottom floor (DESIGN.md, "Layers"): its modules import nothing of
kasper_py above it, and what they may import imports no part of ``kafka/`` back. Every
import counts, inside functions and under ``TYPE_CHECKING`` too (the graph of
``test_import_circles``). The in-memory broker and its faults, which drive the turn and
the stores, live on the testing side (``kasper_py.testing``)."""

from __future__ import annotations

from test_import_circles import import_graph

FLOOR = "kasper_py.kafka"
BELOW = ("kasper_py._support", "kasper_py.config", "kasper_py.exceptions",
         "kasper_py.message", "kasper_py.output_topic", "kasper_py.registry",
         "kasper_py.serdes")
"""What ``kafka/`` may import: the values, errors and settings every layer shares. The
registry is here because ``Config`` holds a ``RegistryConfig``."""


def within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """The imports of a ``kafka/`` module that reach neither ``kafka/`` nor ``BELOW``."""
    return [f"{importer} imports {target}"
            for importer, targets in sorted(graph.items()) if within(importer, (FLOOR,))
            for target in sorted(targets) if not within(target, (FLOOR, *BELOW))]


def reached_from_below(graph: dict[str, set[str]]) -> list[str]:
    """The modules of ``kafka/`` that ``BELOW`` reaches, directly or through others."""
    seen: set[str] = set()
    todo = [module for module in graph if within(module, BELOW)]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return sorted(module for module in seen if within(module, (FLOOR,)))


def test_kafka_imports_nothing_above_it() -> None:
    """No ``kafka/`` module imports the turn, stores, the loop, observability, testing
    or any other part of kasper_py above it."""
    assert upward_imports(import_graph()) == []


def test_nothing_below_kafka_imports_it() -> None:
    """``Config``, the messages, serdes, errors and helpers reach no ``kafka/`` module,
    so ``kafka/`` and what it stands on form no loop."""
    assert reached_from_below(import_graph()) == []


def test_the_floor_checks_see_a_violation() -> None:
    """A ``kafka/`` module importing the turn, and ``config`` importing ``kafka/``
    through a helper, are both found; imports within the floor and below are not."""
    graph = {"kasper_py.kafka.memory": {"kasper_py.turn", "kasper_py.kafka.ports",
                                        "kasper_py.config"},
             "kasper_py.kafka.ports": {"kasper_py.message"},
             "kasper_py.config": {"kasper_py._support.names"},
             "kasper_py._support.names": {"kasper_py.kafka.ports"},
             "kasper_py.turn": {"kasper_py.kafka.memory"}}
    assert upward_imports(graph) == ["kasper_py.kafka.memory imports kasper_py.turn"]
    assert reached_from_below(graph) == ["kasper_py.kafka.ports"]
