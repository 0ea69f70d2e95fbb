"""The fault tests, run again and again with other random moments: the table of issue 35.

Each round runs the fault tests (tests/e2e/test_checkpoint_storage_faults.py,
test_frozen_taskmanager.py, test_network_faults.py, tests/ha/test_leader_faults.py) in one pytest
with STREAMLAB_FAULT_SEED=<round> (tests/faults.py folds it into each fault's seed), and reads the
line each test prints: rows committed, lost, duplicated, and seconds from the fault to the job
running again. A failed test counts as a failed run (its line, if it printed one, still counts).

    .venv/bin/python bench/faults.py [--rounds 3] [-k EXPR]

Needs root (tmpfs mounts, network namespaces, nftables) and Debian's zookeeper, as the tests do.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/e2e/test_checkpoint_storage_faults.py", "tests/e2e/test_frozen_taskmanager.py",
         "tests/e2e/test_network_faults.py", "tests/ha/test_leader_faults.py"]
LINE = re.compile(r"FAULT-RESULT fault=(?P<fault>.+?) rows=(?P<rows>\d+) lost=(?P<lost>\d+) "
                  r"duplicated=(?P<dup>\d+) recover_s=(?P<recover>[\d.]+|-)(?: injected=(?P<injected>\d+))?")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-k", default="", help="pytest -k expression: some faults only")
    args = parser.parse_args()
    results: dict[str, list[dict]] = defaultdict(list)
    failed_tests = 0
    for round_ in range(1, args.rounds + 1):
        command = [sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                   *(["-k", args.k] if args.k else []), *TESTS]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                              env=dict(os.environ, STREAMLAB_FAULT_SEED=f"-round{round_}"))
        lines = [m.groupdict() for m in LINE.finditer(done.stdout)]
        failed = re.search(r"(\d+) failed", done.stdout)
        failed_tests += int(failed.group(1)) if failed else 0
        for line in lines:
            results[line["fault"]].append(line)
        for line in done.stdout.splitlines():  # what failed, and pytest's first line of why
            if line.startswith(("FAILED ", "E   ")) and "Error" in line or line.startswith("FAILED "):
                print(f"  {line[:300]}")
        print(f"round {round_}: {len(lines)} faults reported, {failed.group(1) if failed else 0} tests failed",
              flush=True)
    print()
    print("| fault | runs (faults injected) | rows | lost | duplicated | time to recover (s, median / max) |")
    print("|---|---|---|---|---|---|")
    for fault, runs in sorted(results.items()):
        recover = [float(r["recover"]) for r in runs if r["recover"] != "-"]
        timing = f"{statistics.median(recover):.1f} / {max(recover):.1f}" if recover else "-"
        injected = sum(int(r["injected"] or 1) for r in runs)
        print(f"| {fault} | {len(runs)} ({injected}) | {sum(int(r['rows']) for r in runs):,} | "
              f"{sum(int(r['lost']) for r in runs)} | {sum(int(r['dup']) for r in runs)} | {timing} |")
    print(f"\ntests failed over all rounds: {failed_tests}")


if __name__ == "__main__":
    main()
