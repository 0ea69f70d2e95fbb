"""JobHandle.state of a job without checkpointing: an error saying what to do, or fresh=True."""
from __future__ import annotations

import pytest

from cluster.protocol.endpoint import RpcError
from kernel_runtime import StreamEnvironment
from tests.conftest import wait_for
from tests.e2e.test_state_inspection import assert_counts, rows


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_a_job_without_checkpoints(cluster, client, backend):
    env = StreamEnvironment(parallelism=1, cluster=cluster.cluster_dir, config={"state.backend.type": backend})
    env.from_generator(rows, rate=1_000).key_by("k").count().collect()
    handle = env.execute_async(f"no checkpoints {backend}", client=client)
    try:
        wait_for(lambda: handle.row_count() > 0, 60, "rows")
        with pytest.raises(RpcError, match=r"no completed checkpoint yet: enable checkpointing .* or pass fresh=True"):
            handle.state("count")
        fresh = handle.state("count", fresh=True)  # one taken for the query
        assert fresh.attrs["checkpoint_id"] == 1
        assert_counts(fresh)
        assert handle.status == "RUNNING"
    finally:
        handle.cancel()
        wait_for(lambda: handle.status == "CANCELED", 30, "the job cancelled")
