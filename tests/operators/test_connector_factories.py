"""The client-side connector factories: plain-data params, arguments checked where they are called."""
from __future__ import annotations

import os

import msgpack
import pytest

from cluster.graph.job_graph import GraphValidationError
from kernel_runtime.api.connectors import Connector, FileSink, FileSource, RedisStreamSink, RedisStreamSource

URL = "redis://127.0.0.1:6379/0"


def test_factories_make_connectors_with_plain_data_params(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    made = [FileSource.csv("in", schema={"a": "int64"}, watch=True, monitor_interval=0.5, delimiter=";"),
            FileSource.json_lines("in"), FileSource.parquet("in/*.parquet"), FileSink.parquet("out", rows_per_file=10),
            RedisStreamSource(URL, ["s1", "s2"], count=5, id_field="id"), RedisStreamSink(URL, "s", maxlen=100)]
    assert [c.kind for c in made] == ["file-source"] * 3 + ["file-sink", "redis-stream-source", "redis-stream-sink"]
    for connector in made:
        assert isinstance(connector, Connector) and connector.fn is None
        assert msgpack.unpackb(msgpack.packb(connector.params)) == connector.params
    # relative paths are resolved on the client: the TaskManagers run elsewhere
    assert made[0].params["path"] == os.path.join(str(tmp_path), "in")
    assert made[2].params["path"] == os.path.join(str(tmp_path), "in", "*.parquet")
    assert made[4].params["streams"] == ["s1", "s2"]


@pytest.mark.parametrize("make, message", [
    (lambda: FileSource.csv("x", batch_size=0), "FileSource.csv (test_connector_factories.py:{line}): batch_size "
                                                "must be an integer >= 1, got 0"),
    (lambda: FileSource.csv("x", schema={"a": "integr"}), "schema column 'a' has unknown type 'integr' (accepted: "
                                                          "Spark: boolean, tinyint"),
    (lambda: FileSource.csv("x", schema=["a"]), "schema must be a dict of column -> type name, a DDL string"),
    (lambda: FileSource.csv("x", header=False), "schema must be given when header=False"),
    (lambda: FileSource.csv("x", delimiter=";;"), "delimiter must be one character, got ';;'"),
    (lambda: FileSource.json_lines(None), "FileSource.json_lines (test_connector_factories.py:{line}): "
                                          "path must be a path"),
    (lambda: FileSource.parquet("x", watch="yes"), "watch must be True or False, got 'yes'"),
    (lambda: FileSource.parquet("x", monitor_interval=0), "monitor_interval must be a positive number, got 0"),
    (lambda: FileSink.parquet("x", rows_per_file=0), "FileSink.parquet (test_connector_factories.py:{line}): "
                                                     "rows_per_file must be an integer >= 1"),
    (lambda: FileSink.parquet("x", compression="zip"), "compression must be one of snappy, zstd"),
    (lambda: RedisStreamSource("localhost:6379", "s"), "RedisStreamSource (test_connector_factories.py:{line}): "
                                                       "url must be a Redis URL"),
    (lambda: RedisStreamSource(URL, []), "streams must be a stream key or a list of distinct stream keys"),
    (lambda: RedisStreamSource(URL, ["a", "a"]), "streams must be a stream key or a list of distinct"),
    (lambda: RedisStreamSource(URL, "s", start_id="latest"), "start_id must be an entry id"),
    (lambda: RedisStreamSource(URL, "s", count=0), "count must be an integer >= 1, got 0"),
    (lambda: RedisStreamSource(URL, "s", schema={"id": "string"}, id_field="id"), "id_field must be a name that "
                                                                                   "is not also a schema field"),
    (lambda: RedisStreamSink(URL, ""), "RedisStreamSink (test_connector_factories.py:{line}): stream must be a "
                                       "non-empty string, got ''"),
    (lambda: RedisStreamSink(URL, "s", maxlen=-1), "maxlen must be an integer >= 1, got -1"),
])
def test_wrong_arguments_are_named_with_the_calling_line(make, message):
    line = make.__code__.co_firstlineno
    with pytest.raises(GraphValidationError) as info:
        make()
    assert message.format(line=line) in str(info.value)
