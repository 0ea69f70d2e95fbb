"""Operator implementations, by the kind names of cluster.graph.job_graph.OPERATOR_KINDS."""
from .keyed import KeyedCount
from .sinks import CollectSink, PrintSink
from .sources import GeneratorSource
from .stateless import Filter, MapBatches

OPERATORS = {
    "generator-source": GeneratorSource,
    "map-batches": MapBatches,
    "filter": Filter,
    "keyed-count": KeyedCount,
    "collect-sink": CollectSink,
    "print-sink": PrintSink,
}
