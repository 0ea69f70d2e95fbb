"""Temporary views: the names a query reads its streams by (Flink's createTemporaryView, Spark's
createOrReplaceTempView).

A stream belongs to the environment that built it, so a view of the process (a notebook's
kernel, for every cell's fresh environment) is a definition: a function that builds the stream
on the environment that reads it, as Flink SQL's CREATE TABLE defines a source. A stream of one
environment is a view of that environment only (StreamEnvironment.create_temporary_view).

Thread use: any thread (a lock guards the catalog).
"""
from __future__ import annotations

import re
import threading
from typing import Callable

from cluster.graph.job_graph import GraphValidationError

_lock = threading.Lock()
_definitions: dict[str, Callable] = {}
NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def check_name(name, where: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise GraphValidationError(f"{where}: a view's name is a SQL identifier (letters, digits, _), got {name!r}")
    if name.lower() == "input":
        raise GraphValidationError(f"{where}: 'input' is the name .sql gives the stream before it; name the view "
                                   "otherwise")
    return name.lower()


def create_temporary_view(name: str, definition: Callable) -> None:
    """Register ``definition(env) -> DataStream`` as the view ``name`` of this process, replacing
    one of that name: every environment's ``sql_query`` (and every ``%%stream_sql`` cell) reads it."""
    where = f"create_temporary_view({name!r})"
    key = check_name(name, where)
    if not callable(definition):
        raise GraphValidationError(f"{where}: give a function env -> DataStream that builds the view's stream, "
                                   f"got {type(definition).__name__}")
    with _lock:
        _definitions[key] = definition


def drop_temporary_view(name: str) -> bool:
    with _lock:
        return _definitions.pop(str(name).lower(), None) is not None


def definitions() -> dict[str, Callable]:
    with _lock:
        return dict(_definitions)
