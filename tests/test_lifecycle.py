"""StopRequest: a signal is only noted, the main thread reads why the process must stop."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from cluster.common.lifecycle import STOP_SIGNALS, StopRequest


@pytest.fixture
def handlers():
    saved = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_a_signal_is_noted_and_read_as_the_reason(handlers):
    stop = StopRequest(owner_pid=os.getppid())
    stop.install()
    assert stop.reason is None
    done = threading.Event()
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    assert stop.wait(done) == "SIGTERM"  # the process lives on: the handler did nothing but note it


def test_wait_returns_nothing_once_the_process_is_done(handlers):
    stop = StopRequest()
    stop.install()
    done = threading.Event()
    threading.Timer(0.2, done.set).start()
    assert stop.wait(done) is None


def test_an_owner_that_is_not_the_parent_any_more_is_a_reason_to_stop():
    assert StopRequest(owner_pid=os.getppid()).reason is None
    assert StopRequest(owner_pid=os.getppid() + 100_000).reason == f"its owner (pid {os.getppid() + 100_000}) ended"


def test_handlers_are_installed_on_the_main_thread_only():
    failed = []
    thread = threading.Thread(target=lambda: failed.append(pytest.raises(RuntimeError, StopRequest().install)))
    thread.start()
    thread.join()
    assert failed and "main thread" in str(failed[0].value)
