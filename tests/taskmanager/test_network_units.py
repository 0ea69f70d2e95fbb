"""Credit accounting and input gates, without sockets."""
import threading
import time

import pytest

from cluster.operators.base import TaskCancelled
from cluster.taskmanager.network import END, CreditAccount, InputGate
from cluster.taskmanager.slot_table import SlotTable


def test_producer_waits_for_credit_and_reports_backpressure():
    account = CreditAccount()
    cancelled = threading.Event()
    threading.Timer(0.2, account.add, args=(1,)).start()
    waited = account.take(cancelled)
    assert waited >= 0.15 and account.credit == 0
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
    threading.Timer(0.1, gate.push, args=("a", ("table", 9))).start()
    start = time.monotonic()
    assert gate.poll(5)[1] == ("table", 9) and time.monotonic() - start < 2


def test_slot_table():
    table = SlotTable(2)
    assert table.allocate(0, "j", "a1") and table.allocate(0, "j", "a1")
    assert not table.allocate(0, "k", "a2") and not table.allocate(5, "k", "a2")
    assert table.holds("a1", "j") and not table.holds("a1", "k")
    assert table.free("a1") == "j" and table.free("a1") is None and table.free_count() == 2
