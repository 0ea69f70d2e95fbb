"""Time from running a %%stream cell to its first result row in the kernel, on a warm cluster.

A real kernel (as JupyterLab starts one) loads the extension, starts its embedded cluster and runs
one job to warm it; then, for each run, it times inside the kernel from the moment the cell's
magic is called to

* "returned": the cell's return, job submitted and its dashboard built (what the user waits for
  before the output shows);
* "first row": the first collected row's arrival in the kernel's result buffer (stamped by the
  result receiver's thread, so it may come before the cell returns). That covers parsing, running
  the cell body, building and submitting the JobGraph, scheduling and deploying the tasks, the
  first batch, and its trip to the kernel.

Two pipelines: one task (source -> map -> collect, chained) and two (source -> key_by -> count ->
collect, a network hop). Jobs are cancelled after their first row.

    .venv/bin/python bench/first_row_latency.py [--runs 10]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from jupyter_client.manager import KernelManager

ROOT = Path(__file__).resolve().parent.parent

PIPELINES = {
    "chained (1 task)": "env.from_generator(batch_size=100).map_batches(lambda df: df.assign(x=df.seq * 2)).collect()",
    "key_by (2 tasks)": "env.from_generator(batch_size=100).key_by('seq').count().collect()",
}

TIMED_CELL = """
import time as _time
_t0 = _time.perf_counter()
_job = get_ipython().run_cell_magic("stream", "--name bench", {body!r})
_submitted = _time.perf_counter() - _t0
_job.wait_for_rows(1, timeout=60)
_first_row = _job.summary().first_row_at - _t0
_job.cancel()
while _job.status not in ("CANCELED", "FINISHED", "FAILED"):  # the slots are free for the next run
    _time.sleep(0.02)
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()

    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(ROOT))
    client = manager.client()
    client.start_channels()

    def execute(code: str, expressions: dict | None = None) -> dict:
        reply = client.execute_interactive(code, timeout=120, user_expressions=expressions or {},
                                           output_hook=lambda msg: None)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"{code!r} failed: {reply['content'].get('evalue')}")
        return {k: eval(v["data"]["text/plain"]) for k, v in reply["content"]["user_expressions"].items()}

    try:
        client.wait_for_ready(timeout=60)
        execute("%load_ext kernel_runtime\n%stream_cluster start")
        print(f"{'pipeline':<18} {'runs':>4} {'returned median':>16} {'first row median':>17} {'p95':>8} {'max':>8}")
        for label, body in PIPELINES.items():
            execute(TIMED_CELL.format(body=body))  # warm: Python imports, sockets, the slots
            submitted, first = [], []
            for _ in range(args.runs):
                times = execute(TIMED_CELL.format(body=body), {"s": "_submitted", "f": "_first_row"})
                submitted.append(times["s"] * 1000)
                first.append(times["f"] * 1000)
            print(f"{label:<18} {args.runs:>4} {statistics.median(submitted):>13.0f} ms "
                  f"{statistics.median(first):>14.0f} ms {percentile(first, 0.95):>5.0f} ms {max(first):>5.0f} ms")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)  # the kernel stops its embedded cluster on the way out


if __name__ == "__main__":
    sys.exit(main())
