"""Logging of a cluster process (JobManager, TaskManager): one rolling file, as Flink's log4j
rolling appender does it.

``<name>.log`` is rolled over at ``log.file.max-size`` into ``<name>.log.1`` ... ``.N``
(``log.file.max-backups``), so a process that logs a lot (a flood of refused messages) holds a
bounded amount of disk. What does not go through ``logging`` (a Spark JVM's stderr, a print sink,
a crash before logging is set up) is the process's stdout/stderr, which the launcher sends to
``<name>.out``, as Flink's ``.out`` file. Uncaught exceptions are logged into the rolling file too,
so the log tells why a process or one of its threads died.
"""
from __future__ import annotations

import logging
import sys
import threading
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Optional

from cluster.conf import Configuration
from cluster.conf.options import LoggingOptions

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_process_logging(log_file: Optional[Path], conf: Configuration) -> logging.Handler:
    """Route the root logger to ``log_file`` (rolling), or to stderr without one (a process
    started by hand). Returns the handler."""
    handler: logging.Handler
    if log_file is None:
        handler = logging.StreamHandler()
    else:
        handler = RotatingFileHandler(log_file, maxBytes=conf.get(LoggingOptions.FILE_MAX_SIZE),
                                      backupCount=conf.get(LoggingOptions.FILE_MAX_BACKUPS), encoding="utf-8")
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    if log_file is not None:
        _log_uncaught()
    return handler


def _log_uncaught() -> None:
    log = logging.getLogger("streamlab.uncaught")
    previous_hook, previous_thread_hook = sys.excepthook, threading.excepthook

    def excepthook(kind, value, tb) -> None:
        if not issubclass(kind, KeyboardInterrupt):
            log.critical("uncaught exception", exc_info=(kind, value, tb))
        previous_hook(kind, value, tb)  # and on stderr (<name>.out), as without us

    def thread_excepthook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is not SystemExit and args.exc_value is not None:
            log.critical("uncaught exception in thread %s", getattr(args.thread, "name", "?"),
                         exc_info=(args.exc_type, args.exc_value, args.exc_traceback))
        previous_thread_hook(args)

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
