"""OutputTypes: a stream's columns keep one type from batch to batch, and the error names the
user's column (or the aggregate a partial column belongs to), the operator and a way out."""
import pyarrow as pa
import pytest

from cluster.taskmanager.output_types import ColumnTypeChanged, OutputTypes

WHERE = "operator 'gen' (cell 3, line 2)"


def test_the_same_types_pass_and_a_changed_one_is_refused_naming_column_types_and_operator():
    types = OutputTypes(WHERE)
    types.check(pa.table({"k": [1], "v": [1]}))
    types.check(pa.table({"k": [2], "v": [2]}))
    with pytest.raises(ColumnTypeChanged, match=r"^operator 'gen' \(cell 3, line 2\): column 'v' is string in this "
                                                r"batch but was int64 in the batches before it"):
        types.check(pa.table({"k": [3], "v": ["x"]}))


def test_columns_of_nulls_and_empty_batches_pass_as_they_do_at_an_exchange():
    types = OutputTypes(WHERE)
    types.check(pa.table({}))
    types.check(pa.table({"k": [1], "v": pa.array([None, ], pa.null())}))
    types.check(pa.table({"k": [1], "v": [1.5]}))  # the nulls' column takes its first real type
    types.check(pa.table({"k": [1], "v": pa.array([None], pa.null())}))
    types.check(pa.table({"k": [1], "v": [2.5], "extra": ["a"]}))  # a column more: filled with nulls downstream
    with pytest.raises(ColumnTypeChanged, match="column 'v' is string"):
        types.check(pa.table({"k": [1], "v": ["late"]}))


def test_an_integer_column_turned_float_says_why_pandas_did_it():
    types = OutputTypes(WHERE)
    types.check(pa.table({"n": [1, 2]}))
    with pytest.raises(ColumnTypeChanged, match="nullable 'Int64' dtype"):
        types.check(pa.table({"n": [1.0, None]}))


def test_a_partial_aggregate_column_is_named_by_its_aggregate():
    types = OutputTypes("operator 'aggregate (partial)'")
    types.check(pa.table({"__total__s": [1]}))
    with pytest.raises(ColumnTypeChanged, match="the partial 's' of aggregate column 'total'"):
        types.check(pa.table({"__total__s": ["1"]}))
