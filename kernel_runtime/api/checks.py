"""What every call of the pipeline API checks on the spot, and where in the user's code it was made.

A mistake is reported at the line that made it (``call_site``), before anything is submitted:
a parallelism that is no positive integer, a function that cannot be pickled to ship it, a
connector of the wrong role. Every module of the API uses these; they import nothing of it.
"""
from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Optional

import cloudpickle

from cluster.graph.job_graph import GraphValidationError
from cluster.graph.operator_kinds import KINDS, Role

_API_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def call_site() -> str:
    """file:line of the first caller outside kernel_runtime."""
    frame: Optional[FrameType] = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_API_DIR):
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def plays(connector, role: Role) -> bool:
    """Whether ``connector`` is one of a kind with this role (from_source takes only sources)."""
    name = getattr(connector, "kind", None)
    return isinstance(name, str) and name in KINDS and KINDS[name].role is role


def check_parallelism(value, where: str) -> Optional[int]:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise GraphValidationError(f"{where}: parallelism must be a positive integer, got {value!r}")
    return value


def require_parallelism(value, where: str) -> int:
    """check_parallelism for a setter, where None (use the default) has no meaning."""
    checked = check_parallelism(value, where)
    if checked is None:
        raise GraphValidationError(f"{where}: parallelism must be a positive integer, got None")
    return checked


def pickle_udf(fn, where: str) -> Optional[bytes]:
    if fn is None:
        return None
    if not callable(fn):
        raise GraphValidationError(f"{where}: expected a function, got {type(fn).__name__}")
    try:
        return cloudpickle.dumps(fn)
    except Exception as exc:
        raise GraphValidationError(f"{where}: the function cannot be pickled to ship it to the "
                                   f"TaskManagers: {type(exc).__name__}: {exc}") from None
