"""The pipeline API: StreamEnvironment, DataStream, KeyedStream."""
from cluster.graph.job_graph import GraphValidationError

from .connectors import DiscardingSink, FileSink, FileSource, RedisStreamSink, RedisStreamSource
from .datastream import DataStream, KeyedStream
from .environment import StreamEnvironment
from .time import (Duration, EventTimeSessionWindows, ProcessingTimeSessionWindows, SlidingEventTimeWindows,
                   SlidingProcessingTimeWindows, Time, TumblingEventTimeWindows, TumblingProcessingTimeWindows,
                   WatermarkStrategy)
from .windowed import IntervalJoin, IntervalJoined, JoinedStreams, WindowedStream

__all__ = ["StreamEnvironment", "DataStream", "KeyedStream", "GraphValidationError", "FileSource", "FileSink",
           "RedisStreamSource", "RedisStreamSink", "DiscardingSink", "WatermarkStrategy", "Duration", "Time",
           "TumblingEventTimeWindows", "SlidingEventTimeWindows", "EventTimeSessionWindows",
           "TumblingProcessingTimeWindows", "SlidingProcessingTimeWindows", "ProcessingTimeSessionWindows",
           "WindowedStream", "IntervalJoin", "IntervalJoined", "JoinedStreams"]
