"""The one exception the stack raises.

Kept apart from ``__init__`` only so the private modules can raise it without
importing the package they are part of; ``kasper_py.stack.StackError`` is the name
users see.
"""

from __future__ import annotations


class StackError(Exception):
    """A stack component could not be installed, started, stopped or reached.

    The message says which component, and for a failed start where its log is,
    followed by the last lines of that log.
    """
