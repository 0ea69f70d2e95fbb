"""The pipeline API: StreamEnvironment, DataStream, KeyedStream."""
from cluster.graph.job_graph import GraphValidationError

from kernel_runtime.api.connectors import DiscardingSink, FileSink, FileSource, RedisStreamSink, RedisStreamSource
from kernel_runtime.api.kafka import KafkaSink, KafkaSource
from kernel_runtime.api.nexmark import NexmarkSource
from kernel_runtime.api.datastream import DataStream, KeyedStream
from kernel_runtime.api.environment import StreamEnvironment
from kernel_runtime.api.sql.views import create_temporary_view, drop_temporary_view
from kernel_runtime.api.time import (Duration, EventTimeSessionWindows, ProcessingTimeSessionWindows, SlidingEventTimeWindows, SlidingProcessingTimeWindows, Time, TumblingEventTimeWindows, TumblingProcessingTimeWindows, WatermarkStrategy)
from kernel_runtime.api.windowed import IntervalJoin, IntervalJoined, JoinedStreams, WindowedStream

__all__ = ["StreamEnvironment", "DataStream", "KeyedStream", "GraphValidationError", "FileSource", "FileSink",
           "RedisStreamSource", "RedisStreamSink", "DiscardingSink", "KafkaSource", "KafkaSink", "NexmarkSource", "WatermarkStrategy", "Duration", "Time",
           "TumblingEventTimeWindows", "SlidingEventTimeWindows", "EventTimeSessionWindows",
           "TumblingProcessingTimeWindows", "SlidingProcessingTimeWindows", "ProcessingTimeSessionWindows",
           "WindowedStream", "IntervalJoin", "IntervalJoined", "JoinedStreams", "create_temporary_view",
           "drop_temporary_view"]
