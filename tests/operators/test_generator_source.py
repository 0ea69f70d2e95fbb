"""The generator source's batches under a rate."""
from __future__ import annotations

import time
from types import SimpleNamespace

from .harness import Driven


def test_a_given_batch_size_fixes_every_batch_however_late_the_polls_come():
    # Polls that come at odd moments (a busy task) must not cut short batches: watermarks follow
    # batches, so which rows a window counts as late would follow the machine's load.
    generator = SimpleNamespace(kind="generator-source",
                                params={"count": 200, "rate": 4_000, "batch_size": 10, "split_size": None})
    driven = Driven(generator)
    sizes, pauses = [], iter([0.0, 0.0011, 0.0037, 0.0004, 0.0052, 0.0019] * 40)
    while (table := driven.op.poll()) is not None:
        if table.num_rows:
            sizes.append(table.num_rows)
            assert table.column("seq").to_pylist() == list(range(sum(sizes) - table.num_rows, sum(sizes)))
        time.sleep(next(pauses))
    assert sizes == [10] * 20
