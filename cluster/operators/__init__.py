"""Operator implementations: core operators (stateless, keyed, joins) and windowing/. Each class
registers for its kind of cluster.graph.operator_kinds (``class Filter(Operator, kind="filter")``);
cluster.taskmanager.operator_registry imports every implementation, connectors and Spark included."""
