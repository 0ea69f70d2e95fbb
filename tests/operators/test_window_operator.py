"""The window operator driven as a task drives it, on both state backends, against references
computed here: pandas over the rows a window accepts (tumbling, sliding), and a naive replay that
re-sessionizes the live rows for every row (sessions). Inputs are out of order with late rows
(some within the allowed lateness, some beyond it)."""
from __future__ import annotations

import threading
from typing import Optional

import cloudpickle
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from cluster.conf import TaskConfig
from cluster.graph.job_graph import OperatorSpec
from cluster.taskmanager.operator_registry import OPERATORS
from cluster.operators.base import OperatorContext
from cluster.operators.windowing.contents import BLOCK, WINDOW_STATE
from cluster.graph.event_time import MAX_WATERMARK, NO_WATERMARK
from cluster.operators.windowing.watermarks import TimestampError
from cluster.protocol.metrics import late_rows
from cluster.state.key_groups import key_groups_of_frame, operator_index_for_key_group
from kernel_runtime.client.late_rows import late_rows_frame

MAX_PARALLELISM = 128
BASE = 1_700_000_000_000  # epoch ms
BOUND = 200  # the out-of-orderness the watermarks allow
AGGREGATIONS = {"n": ["v", "count"], "total": ["v", "sum"], "lo": ["v", "min"], "hi": ["v", "max"],
                "avg": ["v", "mean"]}
WHERE = "operator 'windowed' (test.py:7)"


@pytest.fixture(params=["hashmap", "rocksdb"])
def backend(request):
    return request.param


class Driven:
    """One opened operator with what it sent to its side outputs."""

    def __init__(self, kind: str, params: dict, backend: str, tmp_path, udf=None, subtask: int = 0,
                 parallelism: int = 1, late_tag: Optional[str] = None):
        self.side: list[pa.Table] = []
        spec = OperatorSpec(uid="win", kind=kind, name="windowed", call_site="test.py:7", params=params,
                            udf=cloudpickle.dumps(udf) if udf is not None else None)
        config = TaskConfig.from_dict({"state.backend.type": backend, "io.tmp.dirs": str(tmp_path)})
        self.ctx = OperatorContext(
            job_id="job", job_name="test", attempt=0, subtask=subtask, parallelism=parallelism,
            max_parallelism=MAX_PARALLELISM, config=config, result_address=None, cancelled=threading.Event(),
            sender=None, side_outputs=frozenset({("win", late_tag)}) if late_tag else frozenset(),
            emit_side=lambda uid, tag, table: self.side.append(table), execution_id=f"e{subtask}-{id(self)}")
        self.op = OPERATORS[kind](spec, self.ctx)
        self.op.open()

    def feed(self, batches) -> list[pa.Table]:
        out = []
        for table, watermark in batches:
            out += self.op.process(table)
            out += self.op.process_watermark(watermark)[0]
        return out

    def end(self) -> list[pa.Table]:
        return self.op.process_watermark(MAX_WATERMARK)[0] + self.op.finish()


def window_params(assigner: dict, function: str = "aggregate", lateness: int = 0, late_tag=None, **more) -> dict:
    return {"key": ["k"], "upsert_key": ["k", "window_start", "window_end"], "assigner": assigner,
            "time": "event", "rowtime": "ts", "function": function,
            "aggregations": AGGREGATIONS if function == "aggregate" else {}, "allowed_lateness": lateness,
            "late_tag": late_tag, "pre_aggregated": False, **more}


def scenario(seed: int = 1, n: int = 3000, batch: int = 40, keys: str = "abcde", step: int = 7) -> list:
    """(rows, watermark after them) per batch: ~``step`` ms per row, up to 300 ms out of order (more
    than the 200 ms bound: some rows come late), 2% of rows 1-3 s late; the watermark is the
    largest timestamp so far minus the bound and 1 ms."""
    rng = np.random.default_rng(seed)
    ts = BASE + np.arange(n) * step - rng.integers(0, 300, n)
    very_late = rng.random(n) < 0.02
    ts[very_late] -= rng.integers(1000, 3000, int(very_late.sum()))
    frame = pd.DataFrame({"k": rng.choice(list(keys), n), "v": rng.integers(0, 100, n),
                          "ts": pd.to_datetime(ts, unit="ms"), "seq": np.arange(n)})
    batches, newest = [], NO_WATERMARK
    for at in range(0, n, batch):
        part = frame.iloc[at:at + batch].reset_index(drop=True)
        newest = max(newest, int(part["ts"].astype("datetime64[ms]").astype("int64").max()))
        batches.append((part, newest - BOUND - 1))
    return batches


def as_tables(batches):
    return [(pa.Table.from_pandas(rows, preserve_index=False), wm) for rows, wm in batches]


def emitted(tables: list[pa.Table]) -> pd.DataFrame:
    frame = pa.concat_tables(tables).to_pandas()
    for column in ("window_start", "window_end"):
        frame[column] = frame[column].astype("datetime64[ms]").astype("int64")
    return frame


def final_view(frame: pd.DataFrame, key=("k",)) -> pd.DataFrame:
    """The upsert stream's latest row per key and window, sorted."""
    by = list(key) + ["window_start", "window_end"]
    return frame.drop_duplicates(by, keep="last").sort_values(by).reset_index(drop=True)


def emissions(frame: pd.DataFrame) -> dict:
    return frame.groupby(["k", "window_start", "window_end"]).size().to_dict()


# --------------------------------------------------------------------------- references
def windows_reference(batches, size: int, slide: int, lateness: int):
    """Pandas over (row, window) pairs: a pair is accepted when its window was not late at the row's
    arrival; a row with no accepted pair is late. Returns (accepted pairs, late rows, emissions
    per window: one when the watermark passes it holding rows, one per later batch adding rows)."""
    rows = pd.concat([r.assign(arrival_wm=wm_before, batch=i)
                      for i, ((r, _), wm_before) in enumerate(zip(batches, [NO_WATERMARK] + [w for _, w in batches]))],
                     ignore_index=True)
    ts = rows["ts"].astype("datetime64[ms]").astype("int64")
    pairs = []
    for k in range(-(-size // slide)):
        start = ts - np.mod(ts, slide) - k * slide
        inside = start > ts - size
        pairs.append(rows[inside].assign(window_start=start[inside], window_end=start[inside] + size))
    pairs = pd.concat(pairs, ignore_index=True)
    accepted = pairs[pairs["window_end"] - 1 + lateness > pairs["arrival_wm"]]
    late = rows[~rows["seq"].isin(accepted["seq"])].sort_values("seq")
    by = ["k", "window_start", "window_end"]
    on_time = accepted[accepted["window_end"] - 1 > accepted["arrival_wm"]].groupby(by).size() > 0
    updates = accepted[accepted["window_end"] - 1 <= accepted["arrival_wm"]].groupby(by)["batch"].nunique()
    counts = on_time.astype(int).add(updates, fill_value=0).astype(int)
    return accepted, late, {key: n for key, n in counts.items()}


def aggregate_reference(accepted: pd.DataFrame) -> pd.DataFrame:
    out = accepted.groupby(["k", "window_start", "window_end"]).agg(
        n=("v", "count"), total=("v", "sum"), lo=("v", "min"), hi=("v", "max"), avg=("v", "mean"))
    return out.reset_index()


def sessions_reference(batches, gap: int, lateness: int):
    """Row by row: a row is late when its session among the live rows (accepted, not yet cleared)
    would be late; a batch that adds rows to a session the watermark passed updates it; the
    watermark fires sessions it passes and clears those beyond the lateness. Sessions are found
    afresh each time: the rows of a key sorted by time, cut where two are more than the gap apart."""
    live: dict[str, list[tuple[int, int, int]]] = {}  # key -> (ts, v, seq) accepted and not cleared
    out, late, wm = [], [], NO_WATERMARK

    def sessions(rows):
        found = []
        for ts, v, seq in sorted(rows):
            if found and ts - found[-1]["last"] <= gap:
                found[-1]["rows"].append((ts, v, seq))
                found[-1]["last"] = ts
            else:
                found.append({"first": ts, "last": ts, "rows": [(ts, v, seq)]})
        return [(f["first"], f["last"] + gap, f["rows"]) for f in found]

    def emit(key, start, end, rows):
        out.append({"k": key, "window_start": start, "window_end": end,
                    "total": sum(v for _, v, _ in rows), "n": len(rows)})

    for batch, next_wm in batches:
        batch = batch.assign(ts=batch["ts"].astype("datetime64[ms]").astype("int64"))
        added = set()
        for key, ts, v, seq in zip(batch["k"], batch["ts"], batch["v"], batch["seq"]):
            row = (int(ts), int(v), int(seq))
            start, end, _ = next(s for s in sessions(live.get(key, []) + [row]) if row in s[2])
            if end - 1 + lateness <= wm:
                late.append(int(seq))
            else:
                live.setdefault(key, []).append(row)
                added.add(int(seq))
        for key in sorted(live):
            for start, end, rows in sessions(live[key]):
                if end - 1 <= wm and any(seq in added for _, _, seq in rows):
                    emit(key, start, end, rows)
        if next_wm > wm:
            for key in sorted(live):
                kept = []
                for start, end, rows in sessions(live[key]):
                    if wm < end - 1 <= next_wm:
                        emit(key, start, end, rows)
                    if end - 1 + lateness > next_wm:
                        kept += rows
                live[key] = kept
            wm = next_wm
    for key in sorted(live):
        for start, end, rows in sessions(live[key]):
            if end - 1 > wm:
                emit(key, start, end, rows)
    return pd.DataFrame(out), late


# --------------------------------------------------------------------------- tumbling and sliding
def test_tumbling_aggregate_equals_pandas_and_late_rows_go_to_the_side_output(backend, tmp_path):
    batches = scenario()
    driven = Driven("window", window_params({"type": "tumbling", "size": 1000}, late_tag="late"),
                    backend, tmp_path, late_tag="late")
    got = emitted(driven.feed(as_tables(batches)) + driven.end())
    accepted, late, counts = windows_reference(batches, 1000, 1000, 0)
    assert len(late) > 20 and len(accepted) > 2500  # the scenario has both
    expected = aggregate_reference(accepted)
    pd.testing.assert_frame_equal(final_view(got)[list(expected.columns)], expected, check_dtype=False)
    assert emissions(got) == counts and set(counts.values()) == {1}  # no lateness: each window once
    side = pa.concat_tables(driven.side).to_pandas()
    assert side["seq"].tolist() == late["seq"].tolist()
    assert list(side.columns) == ["k", "v", "ts", "seq"]  # the rows as they came
    assert driven.op.metrics()["numLateRecordsDropped"] == 0  # they went to the side output instead
    report, = driven.op.metrics()["late-rows"].values()  # and are seen: the newest 20 of them
    assert (report["count"], report["dropped"], report["side_output"]) == (len(late), 0, "late")
    assert [e["row"]["seq"] for e in report["sample"]] == late["seq"].tolist()[-20:]
    assert all(e["event_time"] <= e["watermark"] for e in report["sample"])
    assert report["schema"] == {"k": "string", "v": "int64", "ts": "timestamp[ns]", "seq": "int64"}
    # as handle.late_rows gives them: the rows in their own types, then when and how late
    frame = late_rows_frame(late_rows([{"subtask": 0, "metrics": driven.op.metrics()}])[0])
    newest = late.tail(20).reset_index(drop=True)
    pd.testing.assert_frame_equal(frame[["k", "v", "ts", "seq"]], newest[["k", "v", "ts", "seq"]], check_dtype=False)
    assert list(frame.columns[4:]) == ["event_time", "watermark", "late_by", "subtask"]
    assert (frame["event_time"].dt.tz_localize(None) == newest["ts"].dt.floor("ms")).all()
    assert (frame["late_by"] >= pd.Timedelta(0)).all() and frame.attrs["count"] == len(late)
    assert driven.op.metrics()["newestEventTimestamp"] == max(
        int(r["ts"].astype("datetime64[ms]").astype("int64").max()) for r, _ in batches)
    # Arrow types of the output: windows as timestamp[ms]
    assert driven.op.process(pa.Table.from_pandas(batches[0][0], preserve_index=False)) == []


def test_sliding_count_equals_pandas_and_counts_late_rows_without_a_side_output(backend, tmp_path):
    batches = scenario(seed=2, n=2000)
    driven = Driven("window", window_params({"type": "sliding", "size": 1000, "slide": 250}, function="count"),
                    backend, tmp_path)
    tables = driven.feed(as_tables(batches)) + driven.end()
    assert tables[0].schema.field("window_start").type == pa.timestamp("ms")
    got = emitted(tables)
    accepted, late, counts = windows_reference(batches, 1000, 250, 0)
    expected = accepted.groupby(["k", "window_start", "window_end"]).size().rename("count").reset_index()
    pd.testing.assert_frame_equal(final_view(got), expected, check_dtype=False)
    assert emissions(got) == counts
    assert driven.op.metrics()["numLateRecordsDropped"] == len(late) > 0
    report, = driven.op.metrics()["late-rows"].values()
    assert (report["count"], report["dropped"], report["side_output"]) == (len(late), len(late), None)
    assert [e["row"]["seq"] for e in report["sample"]] == late["seq"].tolist()[-20:]


def test_allowed_lateness_fires_updated_rows_and_clears_state_after_it(backend, tmp_path):
    batches = scenario(seed=3, n=2500)
    driven = Driven("window", window_params({"type": "tumbling", "size": 1000}, lateness=1500), backend, tmp_path)
    got = emitted(driven.feed(as_tables(batches)))
    accepted, late, counts = windows_reference(batches, 1000, 1000, 1500)
    # state of windows beyond their lateness is gone; the ones still open are few
    live = list(driven.op.backend.items("window"))
    last_wm = batches[-1][1]
    assert live and all(end - 1 + 1500 > last_wm for (_, _, end), _ in live)
    got = pd.concat([got, emitted(driven.end())], ignore_index=True)
    expected = aggregate_reference(accepted)
    pd.testing.assert_frame_equal(final_view(got)[list(expected.columns)], expected, check_dtype=False)
    assert emissions(got) == counts and max(counts.values()) > 1  # updated rows for late data
    assert driven.op.metrics()["numLateRecordsDropped"] == len(late) > 0
    assert driven.op.timers.pending("event") == 0 and not list(driven.op.backend.items("window"))


def test_the_boundaries_of_firing_lateness_and_cleanup_are_flinks(backend, tmp_path):
    """A window [0, 1000) fires at watermark 999; with lateness L a row for it is late once
    999 + L <= watermark, and its state is cleared at that watermark."""
    for lateness in (0, 1):
        driven = Driven("window", window_params({"type": "tumbling", "size": 1000}, "count", lateness=lateness),
                        backend, tmp_path / str(lateness))
        row = lambda t: pa.table({"k": ["a"], "v": [1], "ts": pa.array([BASE + t], pa.int64())})  # noqa: E731
        counts = lambda tables: [(r["window_start"] - BASE, r["count"]) for r in emitted(tables).to_dict("records")] \
            if tables else []  # noqa: E731
        assert driven.op.process(row(10)) == [] and driven.op.process_watermark(BASE + 998)[0] == []
        assert driven.op.metrics()["oldestOpenWindow"] == [BASE, BASE + 1000]  # what the watermark waits to fire
        assert counts(driven.op.process_watermark(BASE + 999)[0]) == [(0, 1)]
        assert "oldestOpenWindow" not in driven.op.metrics()  # fired: a clean-up timer alone is no open window
        late_again = counts(driven.op.process(row(999)))
        assert late_again == ([] if lateness == 0 else [(0, 2)])
        assert driven.op.metrics()["numLateRecordsDropped"] == (1 if lateness == 0 else 0)
        assert counts(driven.op.process(row(1000))) == []  # the next window is not late
        assert driven.op.metrics()["oldestOpenWindow"] == [BASE + 1000, BASE + 2000]
        driven.op.process_watermark(BASE + 999 + lateness)
        # one block per key group and window, its first array the keys
        assert [(k, v[0].tolist()) for k, v in driven.op.backend.items("window")] == \
            [((BLOCK, BASE + 1000, BASE + 2000), ["a"])]
        assert driven.op.process(row(5)) == []
        assert driven.op.metrics()["numLateRecordsDropped"] == (2 if lateness == 0 else 1)


def test_window_all_and_the_min_max_of_strings(backend, tmp_path):
    batches = scenario(seed=10, n=1000)
    batches = [(rows.assign(name=rows["k"] + rows["v"].astype(str)), wm) for rows, wm in batches]
    params = window_params({"type": "tumbling", "size": 1000}, key=[], upsert_key=["window_start", "window_end"])
    params["aggregations"] = {"n": ["v", "count"], "first": ["name", "min"], "last": ["name", "max"]}
    driven = Driven("window", params, backend, tmp_path)
    got = emitted(driven.feed(as_tables(batches)) + driven.end())
    accepted, late, _ = windows_reference(batches, 1000, 1000, 0)
    expected = accepted.groupby(["window_start", "window_end"]).agg(
        n=("v", "count"), first=("name", "min"), last=("name", "max")).reset_index()
    assert list(got.columns) == ["window_start", "window_end", "n", "first", "last"]
    pd.testing.assert_frame_equal(got.sort_values("window_start").reset_index(drop=True), expected, check_dtype=False)
    assert driven.op.metrics()["numLateRecordsDropped"] == len(late) > 0


# --------------------------------------------------------------------------- sessions
def test_sessions_merge_and_a_late_row_bridging_two_fired_sessions_fires_their_union(backend, tmp_path):
    ms = lambda t: pd.Timestamp(BASE + t, unit="ms")  # noqa: E731
    batch = lambda rows: pd.DataFrame(rows, columns=["k", "v", "ts", "seq"])  # noqa: E731
    batches = [
        (batch([("a", 1, ms(0), 0), ("a", 2, ms(50), 1), ("b", 5, ms(10), 2)]), BASE + 100),
        (batch([("a", 3, ms(240), 3), ("a", 4, ms(320), 4)]), BASE + 500),   # sessions [0,150) [240,420) fired
        (batch([("a", 10, ms(150), 5)]), BASE + 600),  # [150,250) touches both: one session [0,420)
        (batch([("a", 20, ms(10), 6)]), BASE + 2000),  # inside the merged one, still within lateness
        (batch([("a", 99, ms(30), 7)]), BASE + 2100),  # beyond the lateness: late
    ]
    params = window_params({"type": "session", "gap": 100}, lateness=1000, late_tag="late")
    params["aggregations"] = {"total": ["v", "sum"], "n": ["v", "count"]}
    driven = Driven("window", params, backend, tmp_path, late_tag="late")
    got = emitted(driven.feed(as_tables(batches)) + driven.end())
    rows = [(r.k, r.window_start - BASE, r.window_end - BASE, r.total, r.n) for r in got.itertuples()]
    assert rows == [("b", 10, 110, 5, 1), ("a", 0, 150, 3, 2), ("a", 240, 420, 7, 2),
                    ("a", 0, 420, 20, 5), ("a", 0, 420, 40, 6)]
    assert pa.concat_tables(driven.side).column("seq").to_pylist() == [7]
    expected, late = sessions_reference(batches, 100, 1000)
    assert late == [7]
    pd.testing.assert_frame_equal(final_view(got)[list(expected.columns)], final_view(expected), check_dtype=False)
    assert emissions(got) == emissions(expected)


def test_random_sessions_equal_the_naive_replay(backend, tmp_path):
    batches = scenario(seed=5, n=400, keys="abc", step=20, batch=10)
    params = window_params({"type": "session", "gap": 60}, lateness=300)
    params["aggregations"] = {"total": ["v", "sum"], "n": ["v", "count"]}
    driven = Driven("window", params, backend, tmp_path)
    got = emitted(driven.feed(as_tables(batches)) + driven.end())
    expected, late = sessions_reference(batches, 60, 300)
    assert len(late) > 0 and emissions(expected) != {}
    pd.testing.assert_frame_equal(final_view(got)[list(expected.columns)], final_view(expected), check_dtype=False)
    assert emissions(got) == emissions(expected)
    # late rows within the lateness merged fired sessions into bigger ones, fired again
    overlapping = got.merge(got, on="k").query("window_start_x <= window_end_y and window_end_x >= window_start_y and "
                                               "(window_start_x != window_start_y or window_end_x != window_end_y)")
    assert len(overlapping) > 0
    assert driven.op.metrics()["numLateRecordsDropped"] == len(late)


def test_merged_sessions_combine_reduced_rows_and_kept_rows(backend, tmp_path):
    batches = scenario(seed=5, n=400, keys="abc", step=20, batch=10)
    expected, _ = sessions_reference(batches, 60, 300)
    expected = final_view(expected)

    def add(acc: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
        return acc.assign(v=acc["v"] + new["v"])

    def summary(key, window, rows: pd.DataFrame):
        return pd.DataFrame({"total": [int(rows["v"].sum())], "n": [len(rows)]})

    for function, udf in (("reduce", add), ("process", summary)):
        params = window_params({"type": "session", "gap": 60}, function, lateness=300)
        driven = Driven("window", params, backend, tmp_path / function, udf=udf)
        got = final_view(emitted(driven.feed(as_tables(batches)) + driven.end()))
        columns = ["k", "window_start", "window_end", "total"] + (["n"] if function == "process" else [])
        got = got.rename(columns={"v": "total"})  # the reduced row's sum
        pd.testing.assert_frame_equal(got[columns], expected[columns], check_dtype=False)


# --------------------------------------------------------------------------- functions
def test_reduce_and_process_functions_see_each_windows_rows(backend, tmp_path):
    batches = scenario(seed=5, n=800)
    accepted, _, counts = windows_reference(batches, 1000, 1000, 800)

    def add(acc: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
        return acc.assign(v=acc["v"] + new["v"], seq=np.maximum(acc["seq"], new["seq"]))

    reduced = Driven("window", window_params({"type": "tumbling", "size": 1000}, "reduce", lateness=800),
                     backend, tmp_path / "r", udf=add)
    got = final_view(emitted(reduced.feed(as_tables(batches)) + reduced.end()))
    expected = accepted.groupby(["k", "window_start", "window_end"]).agg(v=("v", "sum"), seq=("seq", "max"))
    assert list(got.columns) == ["k", "window_start", "window_end", "v", "ts", "seq"]
    pd.testing.assert_frame_equal(got[["k", "window_start", "window_end", "v", "seq"]], expected.reset_index(),
                                  check_dtype=False)

    def summary(key, window, rows: pd.DataFrame):
        return pd.DataFrame({"rows": [len(rows)], "spread": [int(rows["seq"].max() - rows["seq"].min())],
                             "who": [key], "width": [window.end - window.start]})

    processed = Driven("window", window_params({"type": "tumbling", "size": 1000}, "process", lateness=800),
                       backend, tmp_path / "p", udf=summary)
    got = emitted(processed.feed(as_tables(batches)) + processed.end())
    assert list(got.columns) == ["k", "window_start", "window_end", "rows", "spread", "who", "width"]
    assert (got["who"] == got["k"]).all() and (got["width"] == 1000).all()
    got = got.drop(columns=["who", "width"])
    expected = accepted.groupby(["k", "window_start", "window_end"]).agg(
        rows=("seq", "size"), spread=("seq", lambda s: s.max() - s.min())).reset_index()
    pd.testing.assert_frame_equal(final_view(got), expected, check_dtype=False)
    assert emissions(got) == counts


def test_processing_time_windows_fire_on_the_wall_clock(backend, tmp_path):
    params = window_params({"type": "tumbling", "size": 1000}, function="count", time="processing", rowtime=None)
    driven = Driven("window", params, backend, tmp_path)
    assert driven.op.uses_processing_time
    now = [BASE + 100]
    driven.op.clock = lambda: now[0]
    table = pa.table({"k": ["a", "b", "a"], "v": [1, 2, 3]})
    assert driven.op.process(table) == []
    now[0] = BASE + 1500
    assert driven.op.process(table.slice(0, 1)) == []
    assert driven.op.process_watermark(BASE + 5000) == ([], BASE + 5000)  # event time does not fire it
    assert driven.op.on_processing_time(BASE + 998) == []
    first = emitted(driven.op.on_processing_time(BASE + 999)).sort_values("k")
    assert first[["k", "window_start", "count"]].values.tolist() == [["a", BASE, 2], ["b", BASE, 1]]
    second = emitted(driven.op.on_processing_time(BASE + 2000))
    assert second[["k", "window_start", "count"]].values.tolist() == [["a", BASE + 1000, 1]]


# --------------------------------------------------------------------------- pre-aggregation
def slice_partials(batches, assigner: dict, backend: str, tmp_path, slices: Optional[int],
                   aggregations: dict = AGGREGATIONS) -> list:
    """Each batch pre-aggregated as two producers would (each half on its own, both in one batch
    downstream): per window, or per slice of ``slices`` ms (a tumbling window of it)."""
    partial_assigner = assigner if slices is None else \
        {"type": "tumbling", "size": slices, "offset": assigner.get("offset", 0) % slices}
    partial = Driven("window-partial", {"key": ["k"], "rowtime": "ts", "assigner": partial_assigner,
                                        "aggregations": aggregations}, backend, tmp_path / "pp")
    fed = []
    for table, wm in as_tables(batches):
        half = table.num_rows // 2
        fed.append((pa.concat_tables(partial.op.process(table.slice(0, half)) +
                                     partial.op.process(table.slice(half))), wm))
    return fed


@pytest.mark.parametrize("assigner, slices", [({"type": "sliding", "size": 1000, "slide": 500}, None),
                                              ({"type": "sliding", "size": 1000, "slide": 500}, 500),
                                              ({"type": "sliding", "size": 1000, "slide": 300, "offset": 100}, 100)],
                         ids=["per-window", "slices", "slices-of-the-gcd"])
def test_pre_aggregated_input_gives_the_same_results_as_raw_rows(backend, tmp_path, assigner, slices):
    batches = scenario(seed=6, n=2000)
    raw = Driven("window", window_params(assigner, lateness=400), backend, tmp_path / "raw")
    want = emitted(raw.feed(as_tables(batches)) + raw.end())
    fed = slice_partials(batches, assigner, backend, tmp_path, slices)
    more = {"slices": slices} if slices else {}
    merged = Driven("window", window_params(assigner, lateness=400, pre_aggregated=True, **more), backend,
                    tmp_path / "m")
    assert sum(t.num_rows for t, _ in fed) < sum(t.num_rows for t, _ in as_tables(batches))
    got = emitted(merged.feed(fed) + merged.end())
    pd.testing.assert_frame_equal(final_view(got), final_view(want))
    assert emissions(got) == emissions(want)
    assert merged.op.metrics()["numLateRecordsDropped"] == raw.op.metrics()["numLateRecordsDropped"] > 0
    assert not list(merged.op.backend.items(WINDOW_STATE))  # every block (or slice) went with its windows


@pytest.mark.parametrize("assigner", [{"type": "tumbling", "size": 500, "offset": 70},
                                      {"type": "sliding", "size": 1000, "slide": 300, "offset": 100},
                                      {"type": "sliding", "size": 1000, "slide": 250}],
                         ids=["tumbling", "sliding-by-gcd-panes", "sliding-by-slide-panes"])
def test_arrow_partials_by_panes_equal_pandas_partials_of_each_rows_windows(assigner):
    from cluster.graph.windows import assigner_of
    from cluster.operators.windowing.pre_aggregation import arrow_window_partials, assign, window_partials
    rng = np.random.default_rng(3)
    n = 5000
    x = rng.normal(size=n)
    x[rng.random(n) < 0.1] = np.nan
    table = pa.table({"k": rng.integers(0, 40, n), "s": rng.choice(["p", "q"], n),
                      "v": pa.array(rng.integers(0, 100, n), mask=rng.random(n) < 0.05), "x": x})
    ts = BASE + rng.integers(0, 4000, n)
    aggregations = {**AGGREGATIONS, "xs": ["x", "sum"], "xn": ["x", "count"], "xm": ["x", "mean"],
                    "xlo": ["x", "min"], "xhi": ["x", "max"]}
    windows = assigner_of(assigner, WHERE)
    rows, starts, latest = assign(windows, ts)
    key = ["k", "s"]
    want = window_partials(table.to_pandas().take(rows), key, starts, starts + windows.size, latest, aggregations)
    got = arrow_window_partials(windows, table, ts, key, aggregations).to_pandas()
    assert list(got.columns) == list(want.columns)
    by = key + ["window_start"]
    pd.testing.assert_frame_equal(got.sort_values(by).reset_index(drop=True),
                                  want.sort_values(by).reset_index(drop=True), check_dtype=False)
    assert got["__latest__"].sum() == n


# --------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("assigner, slices", [({"type": "session", "gap": 30}, None),
                                              ({"type": "sliding", "size": 1000, "slide": 500}, None),
                                              ({"type": "sliding", "size": 1000, "slide": 250}, 250)],
                         ids=["session", "sliding-blocks", "sliding-slices"])
def test_restore_into_two_subtasks_continues_as_without_the_restore(backend, tmp_path, assigner, slices):
    batches = scenario(seed=7, n=2400, keys="abcdefghij")
    params = window_params(assigner, lateness=500)
    params["aggregations"] = {"total": ["v", "sum"]}
    whole = Driven("window", params, backend, tmp_path / "whole")
    want = emitted(whole.feed(as_tables(batches)) + whole.end())
    if slices:  # the same rows as partials per slice, into a window kept per slice
        batches = [(frame.to_pandas(), wm) for frame, wm in
                   slice_partials(batches, assigner, backend, tmp_path, slices, params["aggregations"])]
        params = {**params, "pre_aggregated": True, "slices": slices}

    cut = len(batches) // 2
    first = Driven("window", params, backend, tmp_path / "first")
    before = first.feed(as_tables(batches[:cut]))
    snapshot = first.op.snapshot_state(1)
    snapshot.keyed.write(tmp_path / "keyed-0")
    handle = {**snapshot.handle, "subtask": 0, "parallelism": 1, "directory": str(tmp_path), "keyed_file": "keyed-0"}
    first.op.close()
    other = "rocksdb" if backend == "hashmap" else "hashmap"
    halves = [Driven("window", params, other, tmp_path / f"half{i}", subtask=i, parallelism=2) for i in range(2)]
    after = []
    for half in halves:
        half.op.restore_state([handle])
        assert half.op.watermark == batches[cut - 1][1]
    for table, wm in as_tables(batches[cut:]):
        frame = table.to_pandas()
        owner = operator_index_for_key_group(key_groups_of_frame(frame[["k"]], MAX_PARALLELISM), MAX_PARALLELISM, 2)
        for i, half in enumerate(halves):
            after += half.op.process(table.filter(pa.array(owner == i)))
            after += half.op.process_watermark(wm)[0]
    after += [t for half in halves for t in half.end()]
    got = emitted(before + after)
    pd.testing.assert_frame_equal(final_view(got), final_view(want))
    assert emissions(got) == emissions(want)


def test_window_state_of_another_layout_is_refused_at_restore(backend, tmp_path):
    """Per-key window timers restored into a tumbling count window (blocks) would never fire."""
    sessions = Driven("window", window_params({"type": "session", "gap": 30}, "count"), backend, tmp_path / "s")
    sessions.feed(as_tables(scenario(seed=2, n=200)[:2]))
    assert sessions.op.timers.pending("event") > 0
    snapshot = sessions.op.snapshot_state(1)
    snapshot.keyed.write(tmp_path / "keyed-0")
    handle = {**snapshot.handle, "directory": str(tmp_path), "keyed_file": "keyed-0"}
    tumbling = Driven("window", window_params({"type": "tumbling", "size": 1000}, "count"), backend, tmp_path / "t")
    with pytest.raises(ValueError, match=r"operator 'windowed' \(test.py:7\): the restored window state is not kept "
                                         r"as per \(key group, window\) blocks"):
        tumbling.op.restore_state([handle])


def test_window_state_kept_per_window_is_refused_by_a_window_kept_per_slice(backend, tmp_path):
    assigner = {"type": "sliding", "size": 1000, "slide": 250}
    per_window = Driven("window", window_params(assigner, "count", pre_aggregated=True), backend, tmp_path / "w")
    per_window.feed(slice_partials(scenario(seed=3, n=200), assigner, backend, tmp_path, None, {}))
    snapshot = per_window.op.snapshot_state(1)
    snapshot.keyed.write(tmp_path / "keyed-0")
    handle = {**snapshot.handle, "directory": str(tmp_path), "keyed_file": "keyed-0"}
    sliced = Driven("window", window_params(assigner, "count", pre_aggregated=True, slices=250), backend, tmp_path / "s")
    with pytest.raises(ValueError, match=r"operator 'windowed' \(test.py:7\): the restored window state is kept per "
                                         r"window, and this window keeps it per slice of 250 ms"):
        sliced.op.restore_state([handle])


# --------------------------------------------------------------------------- bad input
def test_a_missing_or_non_time_rowtime_column_is_a_clear_error(backend, tmp_path):
    driven = Driven("window", window_params({"type": "tumbling", "size": 1000}), backend, tmp_path)
    with pytest.raises(TimestampError, match=r"operator 'windowed' \(test.py:7\): the timestamp column 'ts' is not"):
        driven.op.process(pa.table({"k": ["a"], "v": [1]}))
    with pytest.raises(TimestampError, match=r"operator 'windowed' \(test.py:7\): the timestamp column 'ts' is "
                                             r"string, not a time"):
        driven.op.process(pa.table({"k": ["a"], "v": [1], "ts": ["yesterday"]}))


def test_a_session_gap_of_zero_is_refused_naming_the_operator(backend, tmp_path):
    with pytest.raises(ValueError, match=r"operator 'windowed' \(test.py:7\): a session window: gap must be"):
        Driven("window", window_params({"type": "session", "gap": 0}), backend, tmp_path)
