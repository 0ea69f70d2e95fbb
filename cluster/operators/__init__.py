"""Operator implementations, by the kind names of cluster.graph.job_graph.OPERATOR_KINDS."""
from .files import FileSink, FileSource
from .keyed import KeyedAggregate, KeyedCount, KeyedProcess, KeyedReduce, LocalAggregate
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
    "local-aggregate": LocalAggregate,
    "keyed-aggregate": KeyedAggregate,
    "keyed-reduce": KeyedReduce,
    "keyed-process": KeyedProcess,
    "collect-sink": CollectSink,
    "print-sink": PrintSink,
    "file-sink": FileSink,
    "redis-stream-sink": RedisStreamSink,
}
