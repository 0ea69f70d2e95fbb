"""Credit accounting and input gates, without sockets."""
import sys
import threading

import pytest

from cluster.operators.base import TaskCancelled
from cluster.taskmanager.network import END, CreditAccount, InputGate
from cluster.taskmanager.slot_table import SlotTable

from ..conftest import wait_for


def _waiting_in(thread: threading.Thread, method) -> bool:
    """Whether ``thread`` is blocked on a condition inside ``method``."""
    frame = sys._current_frames().get(thread.ident)
    codes = set()
    while frame is not None:
        codes.add(frame.f_code)
        frame = frame.f_back
    return method.__code__ in codes and threading.Condition.wait.__code__ in codes


def test_producer_waits_for_credit_and_reports_backpressure():
    account = CreditAccount()
    cancelled = threading.Event()
    producer = threading.current_thread()

    def credit_once_the_producer_waits():
        wait_for(lambda: _waiting_in(producer, CreditAccount.take), 10, "the producer waiting for credit")
        account.add(1)
    threading.Thread(target=credit_once_the_producer_waits, daemon=True).start()
    waited = account.take(cancelled)
    assert waited > 0 and account.credit == 0  # the wait is reported as back-pressured time
    account.add(2)
    assert account.take(cancelled) == 0.0 and account.credit == 1


def test_waiting_for_credit_stops_on_cancel():
    account, cancelled = CreditAccount(), threading.Event()
    threading.Timer(0.1, cancelled.set).start()
    with pytest.raises(TaskCancelled):
        account.take(cancelled)


def test_gate_round_robins_and_finishes_when_every_channel_ended():
    gate = InputGate(["a", "b"])
    gate.push("a", ("table", 1))
    gate.push("a", ("table", 2))
    gate.push("b", ("table", 3))
    got = [gate.poll(0)[1][1] for _ in range(3)]
    assert got == [1, 3, 2]
    assert gate.poll(0) is None and not gate.finished
    gate.push("a", END)
    gate.push("b", END)
    gate.poll(0), gate.poll(0)
    assert gate.finished




def test_gate_poll_wakes_on_push():
    gate = InputGate(["a"])
    got = []
    poller = threading.Thread(target=lambda: got.append(gate.poll(600)), daemon=True)  # far longer than the test
    poller.start()
    wait_for(lambda: _waiting_in(poller, InputGate.poll), 10, "the poll waiting on an empty gate")
    gate.push("a", ("table", 9))
    poller.join(30)  # a poll the push did not wake would sleep out its 600 s
    assert not poller.is_alive(), "the push did not wake the waiting poll"
    assert got == [("a", ("table", 9))]


def test_slot_table():
    table = SlotTable(2)
    assert table.allocate(0, "j", "a1") and table.allocate(0, "j", "a1")
    assert not table.allocate(0, "k", "a2") and not table.allocate(5, "k", "a2")
    assert table.holds("a1", "j") and not table.holds("a1", "k")
    assert table.free("a1") == "j" and table.free("a1") is None and table.free_count() == 2
