"""The endpoint's loop rule and its hand-over of blocking work, on a real (in-process) loop."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from cluster.protocol.codec import Codec
from cluster.protocol.endpoint import RpcEndpoint


@pytest.fixture
def endpoint():
    ep = RpcEndpoint("loop-test", Codec(b"s" * 32))
    ep.start()
    yield ep
    ep.stop()


def test_state_touched_off_the_loop_thread_is_caught(endpoint):
    endpoint.call(endpoint.assert_loop_thread)  # on the loop: fine
    with pytest.raises(AssertionError, match="not from the endpoint's loop thread"):
        endpoint.assert_loop_thread()  # the test's thread


def test_blocking_work_reports_back_on_the_loop_thread(endpoint):
    done = threading.Event()
    seen: dict = {}
    release = threading.Event()

    def then(result, error):
        seen.update(result=result, error=error, thread=threading.current_thread())
        done.set()

    with ThreadPoolExecutor(max_workers=1) as storage:
        endpoint.call(lambda: endpoint.run_blocking(storage, lambda: release.wait(5) and 42, then=then))
        assert endpoint.call(lambda: "the loop answers while the disk is busy") == \
            "the loop answers while the disk is busy"
        release.set()
        assert done.wait(5)
    assert seen["result"] == 42 and seen["error"] is None and seen["thread"] is endpoint._thread

    def fail():
        raise OSError("No space left on device")
    done.clear()
    with ThreadPoolExecutor(max_workers=1) as storage:
        endpoint.call(lambda: endpoint.run_blocking(storage, fail, then=then))
        assert done.wait(5)
    assert isinstance(seen["error"], OSError) and seen["thread"] is endpoint._thread


def test_the_local_address_towards_a_peer_is_on_its_route():
    from cluster.protocol.sockets import local_address_towards
    assert local_address_towards("tcp://127.0.0.1:6123") == "127.0.0.1"
    # a name not resolvable (yet): loopback, as before a cluster spanned hosts
    assert local_address_towards("tcp://no-such-host.invalid:6123") == "127.0.0.1"


def test_a_message_that_came_during_a_long_step_is_handled_before_a_due_timer_judges(endpoint):
    """The TaskManager's heartbeat check is a timer: a heartbeat that reached the socket while the
    loop was busy (many tasks deployed at once) must count before the check runs."""
    import time

    import zmq

    from cluster.protocol.task_executor_messages import HeartbeatFromResourceManager

    address = endpoint.call(lambda: endpoint.bind_router("tcp://127.0.0.1:0"))
    router = endpoint._sockets[-1]
    sender = RpcEndpoint("sender", Codec(b"s" * 32))
    sender.start()
    heard, judged = threading.Event(), {}
    endpoint.handlers[HeartbeatFromResourceManager] = lambda msg, peer: heard.set()
    sent = threading.Event()

    def long_step():
        endpoint.call_later(0, lambda: judged.setdefault("heard", heard.is_set()))  # due at once
        assert sent.wait(10)
        deadline = time.monotonic() + 10  # a backstop: the heartbeat reaches the socket in microseconds
        while not router.getsockopt(zmq.EVENTS) & zmq.POLLIN and time.monotonic() < deadline:
            time.sleep(0.001)

    try:
        peer = sender.call(lambda: sender.connect_dealer(address, b"tm"))
        endpoint.call_soon(long_step)
        sender.call(lambda: sender.send(peer, HeartbeatFromResourceManager()))
        sent.set()
        assert heard.wait(10)
        endpoint.call(lambda: None)  # the judging timer has run by now (same loop turn)
    finally:
        sender.stop()
    assert judged == {"heard": True}


def test_a_long_step_and_the_late_timers_behind_it_are_logged_by_name(endpoint, caplog, monkeypatch):
    """A TaskManager judged lost though it lived: its log must say whether one step held its loop
    (which one) or the process got no CPU, so a heartbeat timeout can be told from a death."""
    import logging
    import time

    from cluster.protocol import endpoint as module
    monkeypatch.setattr(module, "STALL_WARN_S", 0.05)
    ticked = threading.Event()

    def heartbeat():
        ticked.set()

    def deploy_many_tasks():
        endpoint.call_later(0, heartbeat)  # due at once, run only after this step
        time.sleep(2 * module.STALL_WARN_S)  # a step that holds the loop past STALL_WARN_S

    with caplog.at_level(logging.WARNING, logger=module.__name__):
        endpoint.call_soon(deploy_many_tasks)
        assert ticked.wait(10)
        endpoint.call(lambda: None)  # the warnings are written before the next step
    messages = [r.getMessage() for r in caplog.records]
    assert any("deploy_many_tasks took" in m and "on the loop thread" in m for m in messages), messages
    assert any("a timer (test_a_long_step_and_the_late_timers_behind_it_are_logged_by_name.<locals>.heartbeat) "
               "ran" in m and "ms late" in m for m in messages), messages
