"""The dashboard on a real job of the session cluster: a slow operator back-pressures its source.

Outside a kernel the feed applies its updates on its own thread (nothing else touches the
widgets here), so the components can be read as the page would show them."""
import re
import time

import pandas as pd
import pytest

from kernel_runtime import JobClient, StreamEnvironment
from kernel_runtime.client.results import ResultMode
from kernel_runtime.notebook.widgets import Dashboard
from kernel_runtime.notebook.widgets.feed import Snapshot

from ..conftest import wait_for


def slow(df):
    time.sleep(len(df) * 20e-6)  # at most 50,000 rows/s, slower than the source
    return df


@pytest.fixture
def dashboard(cluster):
    env = StreamEnvironment(parallelism=1)
    (env.from_generator(lambda seq: pd.DataFrame({"user": seq % 5}), count=400_000, batch_size=1000, name="events")
        .rebalance().map_batches(slow, name="slow step")
        .key_by("user").count(name="per user").collect(name="counts"))
    client = JobClient(cluster.info)
    handle = client.submit(env.get_job_graph("backpressure"), result_mode=ResultMode())
    board = Dashboard(handle, poll_interval=0.2, rows=5)
    yield board
    board.close()
    handle.cancel()
    wait_for(lambda: handle.status == "CANCELED", 15, "the job cancelled")
    client.close()


def parse_hsl(color: str) -> tuple[int, int, int]:
    hue, saturation, lightness = re.fullmatch(r"hsl\((\d+), (\d+)%, (\d+)%\)", color).groups()
    return int(hue), int(saturation), int(lightness)


def records_in(board) -> list[int]:
    return [int(n.replace(",", "")) for n in re.findall(r"<td[^>]*>([\d,]+)</td>", board.throughput.table.value)[::2]]


def test_the_views_follow_the_job(dashboard):
    board = dashboard
    def backpressure_rows():
        return re.findall(r"<tr>(.*?)</tr>", board.backpressure.table.value)[1:]

    def slow_step_busy_and_source_backpressured():
        rows = backpressure_rows()
        return ("slow step (1) RUNNING" in board.slots.root.value and len(rows) == 3
                and 'data-level="HIGH"' in rows[0] and 'data-level="OK"' in rows[1])

    wait_for(slow_step_busy_and_source_backpressured, 30, "the source back-pressured by the slow step")
    source, step, _ = backpressure_rows()
    assert "Source: events" in source and "slow step" in step
    busy = int(re.findall(r">(\d+)%<", step)[0])
    assert busy >= 50, step  # the slow step is busy, its source waits for credit

    assert 'data-state="RUNNING"' in board.status.header.value
    assert re.search(r"Slots: 1 of 4 held by this job", board.slots.root.value)
    assert board.slots.root.value.count('data-state="busy"') == 1  # slot sharing: one slot holds all three
    graph = board.graph.root.value
    assert graph.count('class="streamlab-vertex"') == 3 and "REBALANCE" in graph and "HASH" in graph
    # coloured as Flink's job graph: the busy step red, its back-pressured source dark grey, not the other way
    boxes = {" / ".join(re.findall(r">([^<]+)</text>", box)): re.search(r'<rect [^>]*fill="([^"]+)"', box)[1]
             for box in graph.split('<g class="streamlab-vertex"')[1:]}
    fills = {name: parse_hsl(next(fill for text, fill in boxes.items() if name in text))
             for name in ("events", "slow step")}
    source, step = fills["events"], fills["slow step"]
    assert step[0] <= 60 and step[1] > 0, boxes  # a warm hue: busy (an idle vertex is blue, 210)
    assert source[1] == 0 and source[2] <= 60, boxes  # grey to black: back-pressured
    # and named: the slow step is the bottleneck, in the graph and the table; the source is not
    marked = [text for text in boxes if "bottleneck" in text]
    assert len(marked) == 1 and "slow step" in marked[0], boxes
    assert graph.count('data-bottleneck="1"') == 1
    wait_for(lambda: [("bottleneck" in row) for row in backpressure_rows()] == [False, True, False], 30,
             "the slow step named the bottleneck in the table")
    assert "no checkpoints" in board.checkpoints.root.value

    before = records_in(board)
    wait_for(lambda: records_in(board)[0] > before[0] + 2000, 15, "more records")
    assert board.progress.bar.value > 0 and "of 400,000 rows from the sources" in board.progress.label.value
    (results,) = board.results.sinks
    wait_for(lambda: 'data-rows="0"' not in results.summary.value and results.filled, 15, "result rows")
    assert "an upsert table keyed by <b>user</b>" in results.summary.value
    # a point per update (how many by now depends on the machine's load: wait for them)
    wait_for(lambda: len(board.backpressure.chart.source.data["t"]) >= 5, 15, "five chart points")
    assert board.feed.running


def test_an_update_that_changes_nothing_sends_nothing(dashboard):
    board = dashboard
    wait_for(lambda: board.updates > 3, 15, "updates")
    board.close()
    wait_for(lambda: not board.feed.running, 5, "the feed stopped")
    # the results' header counts the rows received, which a running job adds to between the two
    # updates (a fresh-clone run: 35 rows, then 40): the job ends first, its tasks before its state
    board.handle.cancel()
    wait_for(lambda: board.handle.status == "CANCELED", 15, "the job cancelled")
    client = board.handle.client
    snapshot = Snapshot(time.monotonic(), client.job_details(board.handle.job_id),
                        client.cluster_overview().overview, client.cluster_overview().taskmanagers)
    board.apply(snapshot)
    changes = []
    for component in board.components:
        for widget in component.synced():
            widget.observe(changes.append)
    points = len(board.throughput.chart.source.data["t"])
    board.apply(snapshot)
    assert changes == [] and len(board.throughput.chart.source.data["t"]) == points


def test_a_sink_shows_the_rows_it_delivered_and_a_short_job_its_totals_without_empty_charts(cluster):
    env = StreamEnvironment(parallelism=1)
    (env.from_generator(lambda seq: pd.DataFrame({"v": seq}), count=3_000, batch_size=1_000, name="numbers")
        .filter(lambda df: df.v % 3 == 0, name="thirds").collect(name="kept"))
    client = JobClient(cluster.info)
    handle = client.submit(env.get_job_graph("short"), result_mode=ResultMode())
    board = Dashboard(handle, poll_interval=0.2, rows=5)
    try:
        # source, filter and sink chained in one vertex: nothing goes to another task, 1,000 rows out of the job
        wait_for(lambda: 'data-state="FINISHED"' in board.status.header.value
                 and "1,000 <span" in board.throughput.table.value, 60, "the job's totals")
        (row,) = re.findall(r"<tr>(.*?)</tr>", board.throughput.table.value)[1:]
        assert re.findall(r"<td[^>]*>([\d,]+)", row)[:2] == ["3,000", "1,000"] and "delivered" in row, row
        charts = (board.throughput.chart, board.backpressure.chart)
        wait_for(lambda: all(c.widget.layout.display == ("none" if len(c.source.data["t"]) < 2 else None)
                             for c in charts), 15, "the charts shown only with two points or more")
    finally:
        board.close()
        client.close()
