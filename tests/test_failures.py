"""How a failure reads (cluster.common.failures): the one-line root cause and the user's traceback.

The user's functions here are compiled from "cells" under the file names ipykernel gives them and
run through the real map-batches and filter operators, so the traceback has the framework's frames
that must be hidden.
"""
from __future__ import annotations

import threading

import cloudpickle
import pandas as pd
import pyarrow as pa
import pytest

from cluster.common import failures
from cluster.conf import TaskConfig
from cluster.common.failures import Failure, UserFunctionError
from cluster.graph.job_graph import GraphValidationError, JobGraph, JobVertex, OperatorSpec
from cluster.taskmanager.operator_registry import OPERATORS
from cluster.operators.base import OperatorContext

CELL_FILE = "/tmp/ipykernel_4242/283820497.py"
HELPERS_FILE = "/tmp/ipykernel_4242/1190755127.py"
CELLS = {"283820497.py": {"name": "In [5]", "source": "\nimport pandas as pd\n"
                                                    "def enrich(df):\n    return df['nope']\n"},
         "1190755127.py": {"name": "In [3]", "source": "def lookup(df):\n    return df.nope\n"}}
FRAMEWORK = ("cluster/", "kernel_runtime/", "task.py", "operators/base.py", "stateless.py", "threading")


def from_cell(filename: str, name: str, cells=CELLS):
    namespace: dict = {}
    exec(compile(cells[filename.rsplit("/", 1)[1]]["source"], filename, "exec"), namespace)
    return namespace[name]


def operator(kind: str, name: str, fn, call_site: str = "283820497.py:9"):
    spec = OperatorSpec(uid="op", kind=kind, name=name, call_site=call_site, udf=cloudpickle.dumps(fn))
    ctx = OperatorContext(job_id="job", job_name="test", attempt=1, subtask=0, parallelism=1, max_parallelism=128,
                          config=TaskConfig.from_dict({}), result_address=None, cancelled=threading.Event(),
                          sender=None)
    return OPERATORS[kind](spec, ctx)


def failure_of(op, table=pa.table({"a": [1, 2]})) -> BaseException:
    """The exception of ``op`` processing ``table``, raised on a thread as a task's would be."""
    caught: list[BaseException] = []

    def run():
        try:
            op.process(table)
        except Exception as exc:
            caught.append(exc)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert caught, "the operator did not fail"
    return caught[0]


def test_a_key_error_in_a_cell_function_is_one_line_naming_operator_and_cell_line():
    exc = failure_of(operator("map-batches", "enrich", from_cell(CELL_FILE, "enrich")))
    assert isinstance(exc, UserFunctionError)
    assert failures.root_cause(exc, CELLS) == "KeyError: 'nope', in operator 'enrich' (In [5], line 4)"
    trace = failures.user_traceback(exc, CELLS)
    assert "  In [5], line 4, in enrich\n    return df['nope']\n" in trace
    assert trace.rstrip().endswith("KeyError: 'nope'")
    assert "pandas" in trace  # other libraries' frames stay, as Python shows them
    for name in FRAMEWORK + ("283820497.py", "UserFunctionError"):
        assert name not in trace, name


def test_an_attribute_error_of_a_function_from_an_earlier_cell_names_that_cell():
    exc = failure_of(operator("map-batches", "look up", from_cell(HELPERS_FILE, "lookup")))
    text = failures.describe(exc, CELLS)
    failure = Failure.parse(text)
    assert failure.headline == "AttributeError: 'DataFrame' object has no attribute 'nope', " \
                               "in operator 'look up' (In [3], line 2)"
    assert failure.traceback.startswith("Traceback (most recent call last):\n  In [3], line 2, in lookup\n"
                                        "    return df.nope\n")
    assert not any(name in failure.traceback for name in FRAMEWORK)


def test_outside_a_notebook_places_are_file_and_line():
    exc = failure_of(operator("map-batches", "enrich", from_cell(CELL_FILE, "enrich"), call_site="job.py:9"))
    assert failures.root_cause(exc, {}) == "KeyError: 'nope', in operator 'enrich' (283820497.py:4)"
    trace = failures.user_traceback(exc, {})
    assert f'  File "{CELL_FILE}", line 4, in enrich\n' in trace
    assert not any(name in trace for name in FRAMEWORK)


def test_a_check_of_what_the_function_returned_keeps_its_words_with_the_cell_named():
    exc = failure_of(operator("filter", "bad filter", lambda df: df["a"] * 2))
    assert isinstance(exc, UserFunctionError) and exc.__cause__ is None
    assert failures.root_cause(exc, CELLS).startswith(
        "operator 'bad filter' (In [5], line 9): the predicate must return one boolean per row (2), got dtype int64")


def test_without_user_code_in_it_a_failure_keeps_every_frame_to_be_reported():
    def broken_runtime():
        raise RuntimeError("a bug of ours\nwith details")
    try:
        broken_runtime()
    except RuntimeError as exc:
        failure = Failure.parse(failures.describe(exc, CELLS))
    # this test's file counts as user code: a failure raised in it is located there
    assert failure.headline.startswith("RuntimeError: a bug of ours, at test_failures.py:")
    spark_like = RuntimeError("x")
    spark_like.__traceback__ = None
    assert failures.root_cause(spark_like, CELLS) == "RuntimeError: x"
    assert failures.is_hidden(threading.__file__) and failures.is_hidden(failures.__file__)
    assert failures.is_hidden(pytest.importorskip("pyspark").__file__)
    assert not failures.is_user_code(pd.__file__, CELLS) and not failures.is_hidden(pd.__file__)
    assert failures.is_user_code(CELL_FILE, {}) and failures.is_user_code(__file__, {})


@pytest.mark.parametrize("message, line", [
    ("[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter with name `cty` cannot be "
     "resolved. Did you mean one of the following? [`city`, `amount`]. SQLSTATE: 42703;\n'Project ['cty]\n"
     "+- LogicalRDD [city#0, amount#1L], false\n",
     "[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter with name `cty` cannot be "
     "resolved. Did you mean one of the following? [`city`, `amount`]. SQLSTATE: 42703"),
    ("\n  An exception was thrown from the Python worker. Please see the stack trace below.\n"
     "Traceback (most recent call last):\n  File \"<stdin>\", line 1, in f\n    return x['q']\n"
     "KeyError: 'q'\n", "KeyError: 'q'"),
    ("", ""),
    ("x" * 1000, "x" * (failures.HEADLINE_MAX - 1) + "…"),
])
def test_the_first_meaningful_line_of_a_message(message, line):
    assert failures.first_line(ValueError(message)) == line


def test_the_job_failure_text_reads_back_as_headline_notes_and_traceback():
    exc = failure_of(operator("map-batches", "enrich", from_cell(CELL_FILE, "enrich")))
    text = failures.task_failed(failures.describe(exc, CELLS), "enrich (1/2)", "tm-1")
    text = failures.add_note(text, "The job was not restarted: restart-strategy.type is none.")
    assert text.splitlines()[:4] == ["KeyError: 'nope', in operator 'enrich' (In [5], line 4)",
                                     "Task 'enrich (1/2)' failed on TaskManager tm-1.",
                                     "The job was not restarted: restart-strategy.type is none.", ""]
    failure = Failure.parse(text)
    assert failure.notes == ("Task 'enrich (1/2)' failed on TaskManager tm-1.",
                             "The job was not restarted: restart-strategy.type is none.")
    assert failure.traceback == failures.user_traceback(exc, CELLS).strip("\n")
    # a reason without traceback (a lost TaskManager) reads the same way
    reason = "TaskManager tm-2 lost: no heartbeat for 2000 ms (heartbeat.timeout)"
    lost = failures.task_failed(reason, "src (1/1)", "tm-2")
    assert Failure.parse(lost) == Failure(reason, ("Task 'src (1/1)' failed on TaskManager tm-2.",))


def test_call_sites_in_cells_are_rewritten_and_others_kept():
    text = "operator 'a' (283820497.py:4), operator 'b' (job.py:4), x283820497.py:4"
    assert failures.rewrite_sites(text, CELLS) == \
        "operator 'a' (In [5], line 4), operator 'b' (job.py:4), x283820497.py:4"
    assert failures.rewrite_sites(text, {}) == text


def test_the_job_graph_carries_its_cells_and_checks_them():
    spec = OperatorSpec(uid="s", kind="generator-source", name="gen", call_site="In [5], line 2")
    graph = JobGraph("j", "job", [JobVertex("v", "gen", 1, 128, [spec])], [], cells=dict(CELLS))
    assert JobGraph.from_dict(graph.to_dict()).cells == CELLS
    bad = graph.to_dict() | {"cells": {"283820497.py": {"name": 5, "source": ""}}}
    with pytest.raises(GraphValidationError, match="malformed job graph: TypeError: expected a string, got int"):
        JobGraph.from_dict(bad)
    graph.drop_user_code()
    assert graph.cells == {}


def test_a_chain_keeps_the_users_exceptions_only():
    cells = {"283820497.py": {"name": "In [5]", "source": "def parse(x):\n    try:\n        return int(x)\n"
                                                        "    except ValueError as e:\n"
                                                        "        raise KeyError(x) from e\n"}}
    exc = failure_of(operator("map-batches", "parse", lambda df: from_cell(CELL_FILE, "parse", cells)("z")))
    trace = failures.user_traceback(exc, cells)
    assert trace.count("Traceback (most recent call last):") == 2  # the user's own raise ... from
    assert "ValueError: invalid literal for int() with base 10: 'z'" in trace
    assert "direct cause" in trace and trace.rstrip().endswith("KeyError: 'z'")
    # pandas' inner KeyError under the KeyError it raises for the user has no user frame: left out
    pandas_trace = failures.user_traceback(
        failure_of(operator("map-batches", "enrich", from_cell(CELL_FILE, "enrich"))), CELLS)
    assert pandas_trace.count("Traceback (most recent call last):") == 1 and "direct cause" not in pandas_trace
