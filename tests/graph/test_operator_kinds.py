"""The operator registry: one vocabulary (cluster.graph.operator_kinds), one class per kind on the
TaskManager, one schema rule per kind on the client, and properties that match what runs."""
import pyarrow as pa
import pytest

from cluster.graph.operator_kinds import KINDS, OperatorKind, Output, Role, declare, operator_kind
from cluster.taskmanager.operator_registry import OPERATORS
from cluster.operators.base import Operator, SourceOperator
from cluster.operators.keyed import KeyedOperator
from kernel_runtime import StreamEnvironment
from kernel_runtime.api.schema import SAMPLERS


def test_a_kind_is_declared_once():
    twice = [OperatorKind("twin", Role.TRANSFORM), OperatorKind("twin", Role.SINK)]
    with pytest.raises(ValueError, match="'twin' is declared twice"):
        declare(twice)


def test_the_taskmanager_runs_every_declared_kind_and_nothing_else():
    assert set(OPERATORS) == set(KINDS)
    assert all(cls.kind == name for name, cls in OPERATORS.items())


def test_the_client_samples_every_declared_output_rule():
    assert set(SAMPLERS) == set(Output) - {Output.UNKNOWN}
    assert {k.output for k in KINDS.values()} <= set(Output)


def test_an_implementation_must_name_a_declared_kind_not_taken():
    with pytest.raises(KeyError, match="unknown operator kind 'no-such-kind'"):
        type("Stray", (Operator,), {}, kind="no-such-kind")
    with pytest.raises(TypeError, match="'filter' is run by both Filter and SecondFilter"):
        type("SecondFilter", (Operator,), {}, kind="filter")
    assert OPERATORS["filter"].__name__ == "Filter"


@pytest.mark.parametrize("name", sorted(KINDS))
def test_declared_properties_match_the_implementation(name):
    kind, cls = KINDS[name], OPERATORS[name]
    assert kind.is_source == issubclass(cls, SourceOperator)
    assert kind.keyed == issubclass(cls, KeyedOperator)
    assert kind.stateful == (cls.restore_state is not Operator.restore_state)
    assert not kind.upsert or kind.keyed
    assert not (kind.is_source and kind.is_sink)


def test_an_unknown_kind_is_named_with_the_known_ones():
    with pytest.raises(KeyError, match="unknown operator kind 'mapp'.*map-batches"):
        operator_kind("mapp")


def test_a_spark_step_gets_the_schema_the_client_derived_through_each_rule():
    env = StreamEnvironment(parallelism=1)
    (env.from_generator(lambda seq: {"k": seq % 3, "v": seq * 1.5}, count=10)   # SEQUENCE
        .map_batches(lambda d: d.assign(w=d.v * 2))                              # FUNCTION
        .filter(lambda d: d.k > 0)                                               # INPUT
        .key_by("k").count()                                                     # KEY_COUNT
        .spark(lambda df: df)
        .collect())
    spark = next(o for v in env.get_job_graph().vertices for o in v.operators if KINDS[o.kind].spark)
    schema = pa.ipc.read_schema(pa.py_buffer(spark.params["input_schema"]))
    assert schema.names == ["k", "count"]
    assert schema.field("count").type == pa.int64()


def test_a_spark_step_after_an_unknown_output_is_analysed_at_its_first_batch():
    env = StreamEnvironment(parallelism=1)
    env.from_generator(count=10).key_by("seq").reduce(lambda a, b: a).spark(lambda df: df).collect()
    spark = next(o for v in env.get_job_graph().vertices for o in v.operators if KINDS[o.kind].spark)
    assert "input_schema" not in spark.params
