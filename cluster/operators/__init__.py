"""Operator implementations, by the kind names of cluster.graph.job_graph.OPERATOR_KINDS."""
from .files import FileSink, FileSource
from .keyed import KeyedCount
from .redis_streams import RedisStreamSink, RedisStreamSource
from .sinks import CollectSink, PrintSink
from .sources import GeneratorSource
from .stateless import Filter, MapBatches

OPERATORS = {
    "generator-source": GeneratorSource,
    "file-source": FileSource,
    "redis-stream-source": RedisStreamSource,
    "map-batches": MapBatches,
    "filter": Filter,
    "keyed-count": KeyedCount,
    "collect-sink": CollectSink,
    "print-sink": PrintSink,
    "file-sink": FileSink,
    "redis-stream-sink": RedisStreamSink,
}
