import pytest

from cluster.graph.job_graph import GraphValidationError, JobGraph
from kernel_runtime import StreamEnvironment


def _graph(env, name="t"):
    return env.get_job_graph(name)


def test_forward_operators_with_equal_parallelism_chain_into_one_task():
    env = StreamEnvironment(parallelism=2)
    env.from_generator(count=10).map_batches(lambda d: d).filter(lambda d: d.seq > 0).collect()
    g = _graph(env)
    assert len(g.vertices) == 1 and not g.edges
    assert g.vertices[0].name == "Source: generator -> map_batches -> filter -> collect"


def test_key_by_breaks_the_chain_with_a_hash_edge():
    env = StreamEnvironment(parallelism=2)
    env.from_generator(count=10).key_by("seq").count().collect()
    g = _graph(env)
    assert [v.name for v in g.topological_order()] == ["Source: generator", "count -> collect"]
    (edge,) = g.edges
    assert edge.ship_strategy == "HASH" and edge.key == ["seq"]


def test_parallelism_change_becomes_rebalance_as_in_flink():
    env = StreamEnvironment(parallelism=2)
    env.from_generator(count=10).map_batches(lambda d: d, parallelism=3).collect(name="out")
    g = _graph(env)
    # the sink takes the default parallelism again, as in Flink: 2 -> 3 -> 2
    assert [e.ship_strategy for e in g.edges] == ["REBALANCE", "REBALANCE"]
    assert [v.parallelism for v in g.topological_order()] == [2, 3, 2]


def test_explicit_rebalance_and_broadcast_edges():
    env = StreamEnvironment(parallelism=2)
    src = env.from_generator(count=10)
    src.rebalance().map_batches(lambda d: d).collect(name="a")
    g = _graph(env)
    assert [e.ship_strategy for e in g.edges] == ["REBALANCE"]
    env = StreamEnvironment(parallelism=2)
    env.from_generator(count=10).broadcast().print()
    assert [e.ship_strategy for e in _graph(env).edges] == ["BROADCAST"]


def test_two_consumers_of_one_stream_do_not_chain():
    env = StreamEnvironment(parallelism=1)
    src = env.from_generator(count=10)
    src.collect(name="a")
    src.map_batches(lambda d: d).collect(name="b")
    g = _graph(env)
    assert len(g.vertices) == 3 and all(e.ship_strategy == "FORWARD" for e in g.edges)


def test_graph_survives_the_wire_form_and_revalidates():
    env = StreamEnvironment(parallelism=2)
    env.from_generator(count=10).key_by("seq").count().collect()
    g = _graph(env)
    assert JobGraph.from_dict(g.to_dict()) == g
    bad = g.to_dict()
    bad["vertices"][0]["parallelism"] = 0
    with pytest.raises(GraphValidationError, match="parallelism 0"):
        JobGraph.from_dict(bad)
    with pytest.raises(GraphValidationError, match="malformed job graph"):
        JobGraph.from_dict({"job_id": "x"})


def test_errors_point_at_the_line_that_made_the_operator():
    env = StreamEnvironment()
    src = env.from_generator(count=10)
    with pytest.raises(GraphValidationError, match=r"operator 'map_batches' \(test_chaining.py:\d+\): parallelism"):
        src.map_batches(lambda d: d, parallelism=0)
    with pytest.raises(GraphValidationError, match=r"test_chaining.py:\d+.*expected a function"):
        src.filter("not a function")
    with pytest.raises(GraphValidationError, match=r"test_chaining.py:\d+.*column names"):
        src.key_by()
    with pytest.raises(GraphValidationError, match=r"count must be an integer"):
        env.from_generator(count=-1)


def test_unpicklable_function_is_reported_at_its_line():
    import threading
    lock = threading.Lock()
    env = StreamEnvironment()
    with pytest.raises(GraphValidationError, match=r"test_chaining.py:\d+.*cannot be pickled"):
        env.from_generator(count=1).map_batches(lambda d: (lock, d)[1])


def test_job_needs_a_sink_and_known_config():
    env = StreamEnvironment()
    env.from_generator(count=1)
    with pytest.raises(GraphValidationError, match="no sink"):
        env.get_job_graph()
    with pytest.raises(GraphValidationError, match="unknown configuration key 'restart.strategy'"):
        StreamEnvironment(config={"restart.strategy": "none"})


def test_union_gives_the_next_operator_one_input_per_stream():
    env = StreamEnvironment(parallelism=2)
    a = env.from_generator(count=10, name="a")
    b = env.from_generator(count=10, name="b", parallelism=1)
    a.union(b).key_by("seq").count().collect()
    g = _graph(env)
    (counter,) = [v for v in g.vertices if v.name.startswith("count")]
    assert sorted(e.ship_strategy for _, e in g.inputs_of(counter.id)) == ["HASH", "HASH"]
    with pytest.raises(GraphValidationError, match="a union has no operator"):
        a.union(b).set_parallelism(3)


def test_side_output_edges_are_never_chained_and_name_their_operator():
    env = StreamEnvironment(parallelism=1)
    src = env.from_generator(count=10)
    mapped = src.map_batches(lambda d: d)
    mapped.collect(name="main")
    mapped.get_side_output("malformed").collect(name="bad")
    g = _graph(env)
    (side,) = [e for e in g.edges if e.side_output]
    assert side.side_output[1] == "malformed" and side.ship_strategy == "FORWARD"
    assert side.side_output[0] in {o.uid for o in g.vertex(side.source).operators}
    assert JobGraph.from_dict(g.to_dict()) == g


def test_a_pinned_uid_names_the_operator_and_its_consumers_follow_it():
    from kernel_runtime import StreamEnvironment
    env = StreamEnvironment(parallelism=2)
    counts = env.from_generator(count=10).key_by("seq").count()
    late = counts.filter(lambda df: df["count"] > 0)  # made before the uid was given
    counts.uid("tally").uid("counts")
    late.collect()
    graph = env.get_job_graph("t")
    specs = {o.name: o for v in graph.vertices for o in v.operators}
    assert specs["count"].uid == "counts"
    (count_vertex,) = [v for v in graph.vertices if v.operators[0].name == "count"]
    assert [e.source for e in graph.edges if e.source == count_vertex.id] or \
        any(o.name == "filter" for o in count_vertex.operators)  # the filter reads it, chained or not


def test_an_operator_added_before_a_pinned_one_leaves_its_uid_alone():
    from kernel_runtime import StreamEnvironment

    def build(extra_before: bool, pin: bool):
        env = StreamEnvironment(parallelism=2)
        stream = env.from_generator(count=10)
        if extra_before:
            stream = stream.filter(lambda df: df["seq"] >= 0)
        counts = stream.key_by("seq").count()
        (counts.uid("counts") if pin else counts).collect()
        return {o.name: o.uid for v in env.get_job_graph("t").vertices for o in v.operators}

    assert build(False, pin=False)["count"] != build(True, pin=False)["count"]  # generated: by place
    before, after = build(False, pin=True), build(True, pin=True)
    assert before["count"] == after["count"] == "counts"
    assert before["collect"] == after["collect"]  # hashed from its input's uid, the pinned one


def test_a_duplicate_uid_is_an_error_at_the_users_line():
    from kernel_runtime import StreamEnvironment
    env = StreamEnvironment(parallelism=2)
    source = env.from_generator(count=10).uid("in")
    with pytest.raises(GraphValidationError, match=r"uid \(test_chaining.py:\d+\): operator 'generator' "
                                                   r"\(test_chaining.py:\d+\) has the uid 'in' already"):
        source.filter(lambda df: df["seq"] > 0).uid("in")
    with pytest.raises(GraphValidationError, match="a uid belongs to an operator"):
        source.union(source).uid("both")
    with pytest.raises(GraphValidationError, match="non-empty string"):
        source.filter(lambda df: df["seq"] > 0).uid("")


def test_only_what_a_sink_reads_runs_as_flink_translates_only_what_its_sinks_read():
    """Views whose sources no query of the job reads (Nexmark's three tables, one query) and a
    branch that ends in no sink are not part of the job."""
    env = StreamEnvironment(parallelism=1)
    used = env.from_generator(count=10, name="bids")
    env.from_generator(count=10, name="persons")  # a view's source that the job's query does not read
    used.map_batches(lambda d: d, name="dangling")  # a branch without a sink
    used.filter(lambda d: d.seq > 0, name="kept").collect(name="out")
    (vertex,) = _graph(env).vertices
    assert vertex.name == "Source: bids -> kept -> out"
