"""The pipeline API: StreamEnvironment, DataStream, KeyedStream."""
from cluster.graph.job_graph import GraphValidationError

from .connectors import DiscardingSink, FileSink, FileSource, RedisStreamSink, RedisStreamSource
from .datastream import DataStream, KeyedStream
from .environment import StreamEnvironment

__all__ = ["StreamEnvironment", "DataStream", "KeyedStream", "GraphValidationError", "FileSource", "FileSink",
           "RedisStreamSource", "RedisStreamSink", "DiscardingSink"]
