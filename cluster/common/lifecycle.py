"""How a cluster process learns that it must stop, and makes sure that it does.

A signal handler runs on the main thread between two bytecodes, wherever that thread was: inside
a logging call holding the logging module's lock (py4j's ``__del__`` logs), inside a lock of the
threading module. Work done there may wait for a lock that the interrupted code holds, for ever:
a TaskManager whose handler started its shutdown thread logged that it stopped and lived on. So
the handlers only note the signal, and the main thread, waiting in ``StopRequest.wait``, reads
the note and runs the shutdown as ordinary code, bounded by ``exit_within``.

A process started for an owner (the processes of an embedded or notebook cluster, given
``--owner-pid``) stops when its owner is gone, whatever ended the owner: by Linux's parent-death
signal where the owner spawned it from its main thread (the signal follows the thread that
spawned, not the process), and in every case by a look at its parent's pid at each poll, since
an orphan's parent becomes another process. Its Spark JVM follows it: PySpark's gateway server
exits when the stdin pipe from its Python process closes.

Thread use: ``install`` and ``wait`` on the main thread; ``reason`` from any thread.
"""
from __future__ import annotations

import ctypes
import os
import signal
import threading
from typing import Optional

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
POLL_S = 0.2
# a shutdown that hangs (a call into a JVM that is gone, a lock) ends the process all the same,
# within the 10 s that a launcher's stop waits before it kills
HARD_EXIT_AFTER_S = 8.0
_PR_SET_PDEATHSIG = 1


class StopRequest:
    """Whether this process was asked to stop: by SIGTERM or SIGINT, or by its owner's end."""

    def __init__(self, owner_pid: Optional[int] = None):
        self.owner_pid = owner_pid
        self._signal: Optional[int] = None

    def install(self) -> None:
        """Main thread, once the process can stop in an orderly way (before that, SIGTERM's default
        ends it at once)."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("StopRequest.install runs on the main thread (signal handlers are set there)")
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._note)

    def _note(self, signum: int, frame) -> None:
        self._signal = signum  # nothing more: see the module's docstring

    @property
    def reason(self) -> Optional[str]:
        """Why this process must stop, or None."""
        if self._signal is not None:
            return signal.Signals(self._signal).name
        if self.owner_pid is not None and os.getppid() != self.owner_pid:
            return f"its owner (pid {self.owner_pid}) ended"
        return None

    def wait(self, done: threading.Event) -> Optional[str]:
        """Main thread: until ``done`` is set (None) or this process must stop (why)."""
        while not done.wait(POLL_S):
            reason = self.reason
            if reason is not None:
                return reason
        return None


def follow_owner(owner_pid: Optional[int], parent_death_signal: bool) -> None:
    """First thing in a process started for an owner: SIGTERM when the owner's spawning thread
    ends (``parent_death_signal``: it spawned from its main thread), and an exit now if the owner
    ended before this line ran."""
    if owner_pid is None:
        return
    if parent_death_signal:
        set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != owner_pid:
        raise SystemExit(f"its owner (pid {owner_pid}) ended before it started")


def set_parent_death_signal(signum: int) -> bool:
    """Linux's PR_SET_PDEATHSIG for this process; False where there is no prctl."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def exit_within(seconds: float, what: str) -> None:
    """End the process in ``seconds`` if its shutdown has not by then (a daemon timer)."""
    def hard_exit() -> None:
        # no logging: its lock may be what the shutdown waits for
        os.write(2, f"{what} did not stop within {seconds:g} s: exiting now\n".encode())
        os._exit(1)
    timer = threading.Timer(seconds, hard_exit)
    timer.daemon = True
    timer.start()
