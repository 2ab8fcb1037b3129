"""Applications: several processors in one process (``App``), joined by repartition
topics the app owns (``Repartition``) and by in-process channels (``Channel``), run by
one loop with one consumer, one producer, one turn and one commit. ``plan_for`` turns
a run target (``RunTarget``: a lone processor factory or an app) into what a runner runs;
``describe`` gives an app's topology (``kasper app describe``). See
docs/applications.md.
"""

from kasper_py.app.plan import Plan, RunTarget, describe, plan_for
from kasper_py.app.runtime import AppProcessor, NodeStats
from kasper_py.app.topology import App, Channel, Node, Operator, Repartition

__all__ = ["App", "AppProcessor", "Channel", "Node", "NodeStats", "Operator", "Plan",
           "Repartition", "RunTarget", "describe", "plan_for"]
