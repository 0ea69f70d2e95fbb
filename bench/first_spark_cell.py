"""The first Spark cell of a notebook: seconds from ``%load_ext kernel_runtime`` to its first row.

A real kernel (jupyter_client) runs ``%load_ext kernel_runtime`` and then the quickstart's first
``%%stream`` cell (notebooks/01-quickstart.ipynb: a generator and a ``.sql`` step), and this
process polls the job's row count until the first row is in the kernel. Printed per run:

* ``now``: the cell runs right after %load_ext (Spark is not warm yet): load -> first row;
* ``warm``: the cell runs once every TaskManager's log says its SparkSession is ready, and the
  kernel's own session for planning SQL is up (a user who read the notebook for a while): cell ->
  first row, and how long the TaskManagers' Spark took to get ready;

and the job's status reasons seen meanwhile (the dashboard's header shows them, e.g.
"starting Spark (12 s)"). Figures only, no assertion: the machine's load moves them a lot.

    .venv/bin/python bench/first_spark_cell.py [--when now warm] [--repeat 1] [--code DIR] [--timeline]

``--timeline`` prints the cluster's log lines up to the first row, each at its second after
``%load_ext`` (when the JobManager is up, each TaskManager's JVM starts and is ready, the job deploys).

``--code DIR`` runs another checkout of streamlab, e.g. the code before Spark started at
TaskManager start in notebooks (``git archive <commit> | tar -x -C DIR``), for a before/after.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--when", nargs="+", choices=("now", "warm"), default=["now", "warm"],
                    help="When the Spark cell runs after %%load_ext (default: both).")
parser.add_argument("--repeat", type=int, default=1, help="Runs of each.")
parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="The streamlab source tree to benchmark (default: this one).")
parser.add_argument("--timeout", type=float, default=600.0, help="Seconds a run may take.")
parser.add_argument("--timeline", action="store_true",
                    help="Also print the cluster's log lines up to the first row, in seconds after %%load_ext.")
args = parser.parse_args()
CODE = args.code.resolve()


def quickstart_cell() -> str:
    notebook = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "01-quickstart.ipynb").read_text())
    for cell in notebook["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and source.startswith("%%stream") and ".sql(" in source:
            return source
    raise SystemExit("notebooks/01-quickstart.ipynb has no %%stream cell with a .sql step")


PLANNER = "kernel_runtime.api.sql.analysis"
SESSION = "next(c for c in get_ipython().configurables if type(c).__name__ == 'StreamMagics')._session"


class Kernel:
    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CODE), env.get("PYTHONPATH")]))
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(cwd=str(CODE), env=env)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)

    def execute(self, code: str) -> None:
        reply = self.client.execute_interactive(code, timeout=args.timeout, output_hook=lambda msg: None)
        if reply["content"]["status"] != "ok":
            raise SystemExit(f"the cell failed: {reply['content']}")

    def evaluate(self, expression: str) -> Any:
        reply = self.client.execute_interactive("", user_expressions={"x": expression}, timeout=60,
                                                output_hook=lambda msg: None)
        result = reply["content"]["user_expressions"]["x"]
        if result["status"] != "ok":
            raise SystemExit(f"{expression}: {result}")
        return eval(result["data"]["text/plain"])

    def shutdown(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=False)


def spark_ready_seconds(cluster_dir: Path) -> list[float]:
    """Each TaskManager's 'SparkSession ready in N s' (empty until every one is ready)."""
    figures = []
    for log in sorted((cluster_dir / "log").glob("taskmanager-*.log")):
        found = [line for line in log.read_text().splitlines() if "SparkSession ready in" in line]
        if not found:
            return []
        figures.append(float(found[-1].split("ready in")[1].split()[0]))
    return figures


def timeline(cluster_dir: Path, since: float, until_s: float) -> str:
    """The cluster's log lines from %load_ext to the first row, each at its second after %load_ext."""
    lines = []
    for log in sorted((cluster_dir / "log").glob("*.log")):
        for line in log.read_text().splitlines():
            try:
                at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() - since
            except ValueError:
                continue
            if at <= until_s + 0.5:
                lines.append((at, f"{at:6.2f} {log.stem}: {line[24:][:150]}"))
    return "\n".join(text for _, text in sorted(lines))


def run(when: str, cell: str) -> str:
    kernel = Kernel()
    try:
        loaded, loaded_wall = time.monotonic(), time.time()
        kernel.execute("%load_ext kernel_runtime")
        load_s = time.monotonic() - loaded
        spark = ""
        if when == "warm":
            if not kernel.evaluate(f"hasattr({SESSION}, 'start_in_background')"):
                return f"warm: {CODE} does not start its cluster at %load_ext"
            deadline = time.monotonic() + args.timeout
            cluster_dir = None
            while not (cluster_dir and spark_ready_seconds(cluster_dir)):
                if time.monotonic() > deadline:
                    raise SystemExit("Spark was not ready in time")
                time.sleep(0.5)
                if cluster_dir is None:
                    found = kernel.evaluate(f"{SESSION}.embedded and str({SESSION}.embedded.cluster_dir)")
                    cluster_dir = Path(found) if found else None
            # and the kernel's own SparkSession, which analyses a cell's SQL once it is up (it
            # starts after the TaskManagers')
            while not kernel.evaluate(f"(lambda a: a._session is not None and not a._warming.is_alive())"
                                      f"(__import__('{PLANNER}', fromlist=['_session']))"):
                if time.monotonic() > deadline:
                    raise SystemExit("the SQL planner's session was not up in time")
                time.sleep(0.5)
            ready = spark_ready_seconds(cluster_dir)
            spark = (f"Spark ready {time.monotonic() - loaded:.1f} s after %load_ext "
                     f"(JVM starts: {', '.join(f'{s:.1f} s' for s in ready)}); ")
        started = time.monotonic()
        kernel.execute(cell)
        submitted = time.monotonic()
        reasons: list[str] = []
        while kernel.evaluate("orders.row_count()") == 0:
            reason = kernel.evaluate("orders.job_status().reason")
            if reason and (not reasons or reasons[-1] != reason):
                reasons.append(reason)
            if time.monotonic() - started > args.timeout:
                raise SystemExit("no row in time")
            time.sleep(0.1)
        first_row = time.monotonic()
        if args.timeline:
            cluster_dir = Path(kernel.evaluate(f"str({SESSION}.embedded.cluster_dir)"))
            print(timeline(cluster_dir, loaded_wall, first_row - loaded))
            print(f"{started - loaded:6.2f} the cell starts; {submitted - loaded:6.2f} it ends; "
                  f"{first_row - loaded:6.2f} the kernel has the first row")
        kernel.execute("orders.cancel()")
        shown = f"; reasons shown: {reasons[0]!r} ... {reasons[-1]!r}" if reasons else "; no waiting reason shown"
        if when == "now":
            return (f"now:  %load_ext returned in {load_s:.1f} s; load -> first row {first_row - loaded:.1f} s"
                    f"{shown}")
        return (f"warm: {spark}cell -> first row {first_row - started:.1f} s (the cell ran {submitted - started:.1f} s)"
                f"{shown}")
    finally:
        kernel.shutdown()


def main() -> None:
    cell = quickstart_cell()
    print(f"code: {CODE}; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    for when in args.when:
        for _ in range(args.repeat):
            print(run(when, cell), f"(load average {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
