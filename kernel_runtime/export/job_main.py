"""``main()`` of an exported job (kernel_runtime.export.package): build the pipeline on an environment
configured by the package's config.yaml, run it, and hand its results on.

Kept out of the script so the script stays the notebook's code. Where the job runs is the
environment's business (StreamEnvironment.execute): an embedded cluster under ``python job.py``,
the command's cluster under ``streamlab run`` or in application mode.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Callable, Optional

import pandas as pd
import yaml

from cluster.graph.job_graph import GraphValidationError
from cluster.graph.job_graph import CLUSTER_WIDE_KEYS, JOB_SCOPED_PREFIXES

from kernel_runtime.api import StreamEnvironment
from kernel_runtime.api.environment import CONTEXT_VERBOSE
from kernel_runtime.client.job_handle import JobCancelledError, JobExecutionResult, JobHandle

CONFIG_FILE = "config.yaml"
NAME_KEY = "pipeline.name"


def job_config(script: str | Path) -> dict:
    """The configuration next to the script (empty if there is none)."""
    path = Path(script).resolve().with_name(CONFIG_FILE)
    if not path.exists():
        return {}
    config = yaml.safe_load(path.read_text()) or {}
    if not isinstance(config, dict):
        raise SystemExit(f"{path}: expected a mapping of configuration keys, got {type(config).__name__}")
    return config


def run_job(build: Callable[[StreamEnvironment], object], script: str | Path,
            argv: Optional[list[str]] = None) -> JobExecutionResult | JobHandle:
    parser = argparse.ArgumentParser(prog=Path(script).name, description="Run the exported job (its "
                                     f"configuration: {CONFIG_FILE} next to the script).")
    parser.add_argument("--output", "-o", metavar="OUT", type=Path,
                        help="write each collect sink's final table to OUT/<sink name>.parquet")
    args = parser.parse_args(argv)
    config = job_config(script)
    name = str(config.get(NAME_KEY) or Path(script).resolve().parent.name)
    # the cluster's keys (heartbeats, slots per TaskManager) are for the cluster the job is deployed
    # on (application mode reads config.yaml); a job carries the job-scoped ones
    job_keys = {k: v for k, v in config.items() if k.startswith(JOB_SCOPED_PREFIXES) and k not in CLUSTER_WIDE_KEYS}
    env = StreamEnvironment.get_execution_environment(config=job_keys)
    build(env)
    try:
        result = env.execute(name)
    except JobCancelledError as exc:
        # a cancelled job (an unbounded one, say) still hands on the rows it delivered
        if args.output is not None and getattr(exc, "results", None):
            write_results(exc.results, args.output)
        raise
    if isinstance(result, JobExecutionResult):  # (a JobHandle under streamlab run -d)
        if args.output is not None:
            write_results(result.results, args.output)
        elif os.environ.get(CONTEXT_VERBOSE) != "1":  # streamlab run prints the tables itself
            for sink, frame in result.results.items():
                print(f"{sink}: {len(frame):,} rows\n{frame.head(10).to_string(index=False)}")
    return result


def write_results(results: dict[str, pd.DataFrame], output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    for sink, frame in results.items():
        if "/" in sink or sink in ("", ".", ".."):
            raise GraphValidationError(f"collect sink {sink!r}: not usable as a file name under {output}")
        frame.reset_index(drop=True).to_parquet(output / f"{sink}.parquet")
