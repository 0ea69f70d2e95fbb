"""The TaskManager's SparkSession (cluster/operators/spark.py's SparkRunner), in the test process."""
from __future__ import annotations

import gc
import threading
import time

from cluster.conf import TaskConfig
from cluster.operators.spark import PY4J_RELEASE_POLL_S, SparkRunner


def test_java_objects_python_drops_are_released_in_the_jvm_within_a_fraction_of_a_second():
    # py4j's own pace is a release every second, which kept a second of batches alive in the JVM
    session = SparkRunner.get(TaskConfig.from_dict({})).session_for_task(threading.Event(), lambda detail: None)
    pending = session.sparkContext._gateway._gateway_client.finalizer_deque
    waited = []
    for _ in range(5):
        objects = [session._jvm.java.util.ArrayList() for _ in range(20)]
        del objects
        gc.collect()
        assert pending, "the dropped Java objects were never queued for release"
        started = time.monotonic()
        while pending and time.monotonic() - started < 3:
            time.sleep(0.002)
        waited.append(time.monotonic() - started)
    assert not pending
    # with py4j's 1 s sleep each round waits 0-1 s: five rounds all under 0.3 s by chance is 0.2 %
    assert max(waited) < 0.3, f"releases waited {[round(w, 3) for w in waited]} s (poll {PY4J_RELEASE_POLL_S} s)"
