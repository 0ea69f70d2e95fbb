"""The dashboard's results view on real jobs of the session cluster: the grid is sent what the
client kept (an upsert table per key, an append stream's newest rows) as the Arrow rows Perspective
loads in the page, the chart toggle sets its viewer's settings for a chart over a chosen column, and
the save buttons give the rows as CSV and Parquet files.

Outside a kernel the feed applies its updates on its own thread (nothing else touches the
widgets here), so the grid's traits can be read as the page would receive them (the page itself:
tests/browser/test_first_minutes_in_jupyterlab.py)."""
import base64
import io
import re

import pandas as pd
import pyarrow.parquet as pq
import pytest

from cluster.protocol.serde import ipc_to_table
from kernel_runtime import JobClient, StreamEnvironment
from kernel_runtime.client.results import ResultMode
from kernel_runtime.notebook.widgets import Dashboard
from kernel_runtime.notebook.widgets.result_table import for_the_grid

from ..conftest import wait_for


@pytest.fixture
def client(cluster):
    client = JobClient(cluster.info)
    yield client
    client.close()


def finished_board(client, env, name: str, mode: ResultMode):
    handle = client.submit(env.get_job_graph(name), result_mode=mode)
    board = Dashboard(handle, poll_interval=0.2, rows=5)
    (results,) = board.results.sinks
    # the grid's rows, not only their number: an append stream's grid holds the newest 250 rows
    # long before the job's last batches reach it
    wait_for(lambda: 'data-state="FINISHED"' in board.status.header.value and shows_the_kept_rows(results, handle),
             60, "the job's end and its rows in the grid")
    return board, results, handle


def shows_the_kept_rows(results, handle) -> bool:
    """Whether the grid holds the rows the client kept (their columns the grid has, in any order)."""
    if not results.filled or not results.grid.data:  # the feed's thread may be between the two
        return False
    grid, kept = grid_frame(results), handle.to_pandas()
    common = [c for c in kept.columns if c in grid.columns]
    try:
        pd.testing.assert_frame_equal(grid[common].sort_values(common, ignore_index=True),
                                      kept[common].sort_values(common, ignore_index=True), check_dtype=False)
    except (AssertionError, TypeError, ValueError):
        return False
    return True


def grid_frame(results) -> pd.DataFrame:
    return ipc_to_table(results.grid.data).to_pandas()


def saved(results, kind: str) -> bytes:
    button = next(b for b in results.saves if b.description == kind)
    button.click()
    href = re.search(r'href="data:[^;]+;base64,([^"]+)"', results.link.value)
    assert href, results.link.value
    return base64.b64decode(href[1])


def test_an_upsert_table_is_a_row_per_key_in_the_grid_charted_and_saved(client):
    env = StreamEnvironment(parallelism=2)
    (env.from_generator(lambda seq: pd.DataFrame({"user": seq % 7, "amount": seq % 10}), count=7_000,
                        batch_size=500, name="payments")
        .key_by("user").aggregate(n=("amount", "count"), total=("amount", "sum"), name="per user")
        .filter(lambda df: df.total >= 0, name="all").collect(name="totals"))
    board, results, handle = finished_board(client, env, "upsert view", ResultMode())
    try:
        expected = handle.to_pandas().sort_values("user").reset_index(drop=True)
        assert len(expected) == 7 and expected.n.sum() == 7_000
        shown = grid_frame(results).sort_values("user").reset_index(drop=True)
        pd.testing.assert_frame_equal(shown[list(expected.columns)], expected, check_dtype=False)
        # the filter behind the aggregation leaves it a table per key, and the summary says so
        assert "an upsert table keyed by <b>user</b>" in results.summary.value
        assert results.over.value == "user" and results.value.value == "total"

        grid = results.grid
        assert grid.config["plugin"] == "Datagrid" and grid.config["columns"] == list(expected.columns)
        results.view.value = "bar"
        assert grid.config == {"plugin": "Y Bar", "group_by": ["user"], "columns": ["total"],
                               "aggregates": {"total": "sum"}, "sort": [["user", "asc"]]}
        results.value.value = "n"
        assert grid.config["columns"] == ["n"] and grid.config["aggregates"] == {"n": "sum"}
        results.view.value = "table"
        assert grid.config["plugin"] == "Datagrid" and grid.config["group_by"] == [] and grid.config["sort"] == []

        csv = pd.read_csv(io.BytesIO(saved(results, "CSV"))).sort_values("user").reset_index(drop=True)
        pd.testing.assert_frame_equal(csv, expected, check_dtype=False)
        assert 'download="totals.csv"' in results.link.value
        parquet = pq.read_table(io.BytesIO(saved(results, "Parquet"))).to_pandas()
        pd.testing.assert_frame_equal(parquet.sort_values("user").reset_index(drop=True), expected)
    finally:
        board.close()


def test_an_append_streams_grid_keeps_the_newest_rows_as_the_client_does(client):
    env = StreamEnvironment(parallelism=1)
    (env.from_generator(lambda seq: pd.DataFrame({"seq": seq, "even": seq % 2 == 0}), count=3_000,
                        batch_size=100, name="numbers").collect(name="rows"))
    board, results, handle = finished_board(client, env, "append view", ResultMode("append", max_rows=250))
    try:
        kept = handle.to_pandas()
        assert kept.seq.tolist() == list(range(2_750, 3_000))  # the client's newest 250
        assert sorted(grid_frame(results).seq) == kept.seq.tolist()  # and the grid's, batch by batch
        assert 'data-kind="append"' in results.summary.value and "the newest 250 kept" in results.summary.value
        assert results.value.value == "seq"  # a chart's value is a number, not the flag
    finally:
        board.close()


def test_columns_the_grid_has_no_type_for_are_shown_as_text():
    frame = pd.DataFrame({"k": [1, 2], "items": [[1, 2], [3]], "took": pd.to_timedelta([1, 2], unit="s")})
    import perspective  # the same engine as the page's (its WebAssembly build there)
    table = perspective.table(for_the_grid(frame))
    assert table.schema() == {"k": "integer", "items": "string", "took": "string"}
    assert table.view().to_columns()["items"] == ["[1, 2]", "[3]"]  # not flattened into the rows


def test_a_sql_key_the_query_does_not_select_is_no_choice_of_the_chart(client, spark):
    env = StreamEnvironment(parallelism=1)
    (env.from_generator(lambda seq: pd.DataFrame({"k": seq % 3, "v": seq}), count=300, batch_size=100, name="rows")
        .sql("SELECT count(*) AS n, sum(v) AS total FROM input GROUP BY k", name="per k").collect(name="sums"))
    board, results, handle = finished_board(client, env, "hidden key view", ResultMode())
    try:
        assert sorted(grid_frame(results)["n"]) == [100, 100, 100]
        assert "keyed by columns it does not show" in results.summary.value
        assert list(results.over.options) == ["n", "total"] and results.over.value == "n"
    finally:
        board.close()
