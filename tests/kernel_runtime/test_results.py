"""The result-mode buffers and how the pipeline picks a mode: plain classes, no sockets."""
import pyarrow as pa
import pytest

from cluster.protocol import messages as m
from kernel_runtime import StreamEnvironment
from kernel_runtime.client.result_receiver import _SinkResults
from kernel_runtime.client.results import (KEEP_ALL, AppendBuffer, ResultMode, SingleRowBuffer, UpsertBuffer, upsert_key)


def batch(**columns) -> pa.Table:
    return pa.table(columns)


def test_append_keeps_the_newest_max_rows_and_counts_all():
    buffer = AppendBuffer(max_rows=25)
    for start in range(0, 100, 10):
        buffer.add(batch(seq=list(range(start, start + 10))))
    assert buffer.total == 100 and len(buffer) == 25
    assert buffer.frame().seq.tolist() == list(range(75, 100))
    assert buffer.preview(3).seq.tolist() == [97, 98, 99]


def test_append_without_a_limit_keeps_every_row():
    buffer = AppendBuffer(max_rows=None)
    for start in range(0, 30_000, 1000):
        buffer.add(batch(seq=list(range(start, start + 1000))))
    assert len(buffer) == buffer.total == 30_000


def test_upsert_holds_the_latest_row_per_key_in_first_seen_order():
    buffer = UpsertBuffer(["user"], max_rows=100)
    buffer.add(batch(user=["b", "a"], count=[1, 1]))
    buffer.add(batch(user=["a", "c", "a"], count=[2, 1, 3]))
    buffer.add(batch(user=["b"], count=[2]))
    frame = buffer.frame()
    assert frame.to_dict("list") == {"user": ["b", "a", "c"], "count": [2, 3, 1]}
    assert buffer.total == 6 and len(buffer) == 3


def test_a_row_marked_minus_d_deletes_its_key_until_a_later_row_brings_it_back():
    buffer = UpsertBuffer(["k"], None)
    buffer.add(pa.table({"k": [1, 2, 3], "n": [2, 2, 2], "__sql_op": ["+U", "+U", "-D"]}))
    buffer.add(pa.table({"k": [1, 2], "n": [3, 4], "__sql_op": ["-D", "+U"]}))
    assert buffer.frame().to_dict("list") == {"k": [2], "n": [4]}
    buffer.add(pa.table({"k": [1, 3], "n": [4, 4], "__sql_op": ["+U", "+U"]}))
    assert buffer.frame().sort_values("k").to_dict("list") == {"k": [1, 2, 3], "n": [4, 4, 4]}


def test_upsert_by_two_columns_and_many_batches():
    buffer = UpsertBuffer(["k1", "k2"], max_rows=None)
    for n in range(1, 51):  # each batch: the running count of 6 keys
        buffer.add(batch(k1=[0, 0, 1, 1, 2, 2], k2=["x", "y"] * 3, count=[n] * 6))
    frame = buffer.frame()
    assert len(frame) == 6 and set(frame["count"]) == {50}
    assert buffer.total == 300


def test_upsert_drops_the_keys_updated_longest_ago_beyond_max_rows():
    buffer = UpsertBuffer(["user"], max_rows=3)
    buffer.add(batch(user=["a", "b", "c", "d"], count=[1, 1, 1, 1]))
    buffer.add(batch(user=["a", "e"], count=[2, 1]))
    assert sorted(buffer.frame().user) == ["a", "d", "e"]
    assert buffer.evicted == 2


def test_upsert_reports_rows_without_the_key():
    buffer = UpsertBuffer(["user"])
    with pytest.raises(KeyError, match=r"no column\(s\) \['user'\]"):
        buffer.add(batch(page=["x"]))


def test_single_keeps_only_the_newest_row():
    buffer = SingleRowBuffer()
    buffer.add(batch(total=[1, 2, 3]))
    buffer.add(batch(total=[10]))
    assert buffer.frame().total.tolist() == [10] and buffer.total == 4


def rows(attempt: int, epoch: int = 0, restored_from: int = 0) -> m.CollectBatch:
    return m.CollectBatch("job", attempt, "sink", 0, epoch, restored_from)


def test_results_are_exactly_once_across_restarts():
    sink = _SinkResults(parallelism=1, buffer=AppendBuffer(10))
    sink.receive(rows(1), batch(seq=[1, 2]))
    ack = sink.receive(m.CollectBarrier("job", 1, "sink", 0, checkpoint_id=1))
    assert ack == m.AcknowledgeCollect("job", 1, "sink", 0, 1)  # every row before barrier 1 is here
    sink.receive(rows(1, epoch=1), batch(seq=[3, 4]))
    # attempt 2 restored checkpoint 1: it replays the rows after barrier 1
    sink.receive(rows(2, epoch=1, restored_from=1), batch(seq=[3, 4]))
    sink.receive(rows(1, epoch=1), batch(seq=[5]))  # a straggler of attempt 1
    assert sink.buffer.frame().seq.tolist() == [1, 2, 3, 4] and sink.buffer.total == 4
    assert sink.buffer.max_rows == 10
    # attempt 3 restarted from scratch: everything before it is void
    sink.receive(rows(3), batch(seq=[1]))
    assert sink.buffer.frame().seq.tolist() == [1]
    sink.receive(m.CollectEnd("job", 2, "sink", 0))
    assert not sink.complete  # attempt 2's end does not finish attempt 3
    sink.receive(m.CollectEnd("job", 3, "sink", 0))
    assert sink.complete


def test_a_latest_value_view_keeps_its_rows_on_a_restore():
    sink = _SinkResults(parallelism=1, buffer=UpsertBuffer(["user"]))
    sink.receive(rows(1, epoch=2), batch(user=["a"], count=[5]))
    sink.receive(rows(2, epoch=2, restored_from=2), batch(user=["b"], count=[1]))
    assert sink.buffer.frame().to_dict("list") == {"user": ["a", "b"], "count": [5, 1]}


def _graph(build):
    env = StreamEnvironment(parallelism=2)
    build(env)
    graph = env.get_job_graph("t")
    sinks = {o.name: o.uid for v in graph.vertices for o in v.operators if o.kind == "collect-sink"}
    return graph, sinks


def test_the_pipeline_decides_the_default_mode():
    graph, sinks = _graph(lambda env: (
        env.from_generator(count=10).key_by("seq").count().collect("counts"),
        env.from_generator(count=10).key_by("seq").aggregate(total=("seq", "sum")).collect("totals"),
        env.from_generator(count=10).key_by("seq").process(lambda key, rows, state: rows).collect("events"),
        env.from_generator(count=10).map_batches(lambda d: d).collect("rows")))
    assert upsert_key(graph, sinks["counts"]) == upsert_key(graph, sinks["totals"]) == ["seq"]
    assert upsert_key(graph, sinks["rows"]) is upsert_key(graph, sinks["events"]) is None
    auto = ResultMode()
    assert isinstance(auto.buffer_for(graph, sinks["counts"]), UpsertBuffer)
    assert isinstance(auto.buffer_for(graph, sinks["rows"]), AppendBuffer)
    assert isinstance(ResultMode("append").buffer_for(graph, sinks["counts"]), AppendBuffer)


def test_a_keyed_count_chained_with_its_sink_is_found_too():
    # the count and the collect sink share a vertex (forward edge, equal parallelism)
    graph, sinks = _graph(lambda env: env.from_generator(count=10).key_by("seq").count().collect("c"))
    (vertex,) = [v for v in graph.vertices if len(v.operators) == 2]
    assert [o.kind for o in vertex.operators] == ["keyed-count", "collect-sink"]
    assert upsert_key(graph, sinks["c"]) == ["seq"]


def test_a_filter_behind_a_keyed_count_keeps_its_rows_keyed_chained_or_not():
    # Flink's upsert stream through a WHERE is still keyed: the table per key stays a table
    graph, sinks = _graph(lambda env: (
        env.from_generator(count=10).key_by("seq").count().filter(lambda d: d["count"] > 0).collect("chained"),
        env.from_generator(count=10).key_by("seq").count().filter(lambda d: d["count"] > 0, parallelism=1)
        .filter(lambda d: d["count"] > 1).collect("apart"),
        env.from_generator(count=10).key_by("seq").count().map_batches(lambda d: d).collect("mapped")))
    assert upsert_key(graph, sinks["chained"]) == upsert_key(graph, sinks["apart"]) == ["seq"]
    assert upsert_key(graph, sinks["mapped"]) is None  # a map may change the key's columns


def test_a_changelog_sink_keeps_every_update_row_chained_or_not():
    def build(env):
        counts = env.from_generator(count=10).key_by("seq").count()
        counts.collect("table")
        counts.changelog().collect("log")  # two consumers: the count chains with neither sink
        env.from_generator(count=10).key_by("seq").count().changelog().collect("chained log")
    graph, sinks = _graph(build)
    chained = {o.name: len(v.operators) > 1 for v in graph.vertices for o in v.operators}
    assert not chained["log"] and chained["chained log"]
    assert upsert_key(graph, sinks["table"]) == ["seq"]
    assert upsert_key(graph, sinks["log"]) is upsert_key(graph, sinks["chained log"]) is None
    assert isinstance(KEEP_ALL.buffer_for(graph, sinks["log"]), AppendBuffer)
    with pytest.raises(ValueError, match="collect sink 'log': update mode needs a keyed aggregation .* "
                                         r"not its \.changelog\(\)"):
        ResultMode("update").buffer_for(graph, sinks["log"], "log")


def test_scripts_keep_the_table_per_key_of_an_upsert_stream_and_every_row_of_others():
    graph, sinks = _graph(lambda env: (
        env.from_generator(count=10).key_by("seq").count().collect("counts"),
        env.from_generator(count=10).collect("rows")))
    table, rows = KEEP_ALL.buffer_for(graph, sinks["counts"]), KEEP_ALL.buffer_for(graph, sinks["rows"])
    assert isinstance(table, UpsertBuffer) and table.key == ["seq"] and table.max_rows is None
    assert isinstance(rows, AppendBuffer) and rows.max_rows is None


def test_an_upsert_stream_reaches_a_sink_of_another_parallelism_keyed_by_its_key():
    # rebalanced, an older update of a key could overtake a newer one on its way to the client
    def build(env):
        counts = env.from_generator(count=10).key_by("seq").count(parallelism=3)
        counts.collect("table")
        counts.changelog().collect("log")
        counts.map_batches(lambda d: d, name="after").print()
    graph, _ = _graph(build)
    first = {v.id: v.operators[0].name for v in graph.vertices}
    into = {first[e.target]: (e.ship_strategy, e.key) for e in graph.edges}
    assert into["table"] == into["log"] == ("HASH", ["seq"])
    assert into["after"] == ("REBALANCE", [])  # only sinks: an operator's output keeps Flink's default


def test_update_mode_needs_a_keyed_aggregation():
    graph, sinks = _graph(lambda env: env.from_generator(count=10).collect("rows"))
    with pytest.raises(ValueError, match="collect sink 'rows': update mode needs a keyed aggregation"):
        ResultMode("update").buffer_for(graph, sinks["rows"], "rows")


@pytest.mark.parametrize("mode, max_rows, error", [("upsert", 10, "unknown result mode 'upsert'"),
                                                    (None, 0, "max_rows must be a positive integer")])
def test_result_mode_checks_its_arguments(mode, max_rows, error):
    with pytest.raises(ValueError, match=error):
        ResultMode(mode, max_rows)
