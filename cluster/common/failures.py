"""How a failure reads: the root cause in one line, then the user's traceback without our frames.

A failed task describes its exception here, on the TaskManager (``describe``); the JobMaster adds
which task failed and whether the job restarts (``task_failed``, ``add_note``); the dashboard,
``.wait()``, the CLI and REST read the same text back (``Failure.parse``). The text is:

    KeyError: 'nope', in operator 'enrich' (In [5], line 3)      <- the root cause, one line
    Task 'enrich (1/2)' failed on TaskManager tm-1.              <- notes, one line each
    The job was not restarted: restart-strategy.type is none.
                                                                 <- a blank line
    Traceback (most recent call last):                           <- the user's traceback
      In [5], line 3, in <lambda>
        .map_batches(lambda df: df["nope"])
    ...

Notebook cells are named as their users know them. IPython compiles a cell to a file name of
its own ("/tmp/ipykernel_41/283820497.py"); a job graph submitted from a kernel carries
``cells``: that file's base name -> {"name": "In [5]", "source": the cell's code}, so a frame or a
call site in a cell reads "In [5], line 3" and shows its line of code on a TaskManager that never
saw the cell. Outside a kernel there are no cells and places read "job.py:12" as before.

Frames of streamlab itself, of PySpark and Py4J and of threads are hidden: they say how the
runtime called the user's code, not why it failed. Other libraries' frames (pandas) stay, as
Python shows them.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import sysconfig
import traceback
from dataclasses import dataclass
from types import TracebackType
from typing import Mapping, Optional

# base name of a cell's file -> {"name": "In [5]", "source": "..."}
Cells = Mapping[str, Mapping[str, str]]

HEADLINE_MAX = 400  # characters of an exception's message kept in the one-line cause
_HIDDEN_PACKAGES = ("pyspark", "py4j")
_HIDDEN_STDLIB = ("threading.py", "concurrent", "runpy.py")
_PYTHON_TRACEBACK = "Traceback (most recent call last):"


class UserFunctionError(Exception):
    """A user's function raised or returned the wrong thing; the message names the operator.

    ``operator`` and ``call_site`` are given when the error wraps the user's own exception (raised
    ``from`` it), so the one-line cause can put that exception first."""

    def __init__(self, message: str, operator: Optional[str] = None, call_site: Optional[str] = None):
        super().__init__(message)
        self.operator, self.call_site = operator, call_site


# ---------------------------------------------------------------------- places
def cell_site(filename: str, lineno: Optional[int], cells: Cells) -> Optional[str]:
    """"In [5], line 3" for a place in a cell; None for a place in a file."""
    cell = cells.get(os.path.basename(filename))
    if cell is None:
        return None
    return f"{cell['name']}, line {lineno}" if lineno is not None else cell["name"]


def site(filename: str, lineno: Optional[int], cells: Cells) -> str:
    """A place as the API's call sites name it: "In [5], line 3" in a cell, else "job.py:12"."""
    return cell_site(filename, lineno, cells) or f"{os.path.basename(filename)}:{lineno}"


def rewrite_sites(text: str, cells: Cells) -> str:
    """Every "283820497.py:4" of a cell's file in ``text`` as "In [5], line 4"."""
    if not cells:
        return text
    names = "|".join(re.escape(n) for n in sorted(cells, key=len, reverse=True))
    return re.sub(rf"(?<![\w.])({names}):(\d+)", lambda m: f"{cells[m.group(1)]['name']}, line {m.group(2)}", text)


@functools.cache
def _roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(folders whose frames are hidden, folders of libraries): absolute, with a trailing separator."""
    project = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
    hidden = [os.path.join(project, "cluster"), os.path.join(project, "kernel_runtime")]
    for package in _HIDDEN_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            hidden.extend(spec.submodule_search_locations)
    stdlib = sysconfig.get_paths()["stdlib"]
    hidden.extend(os.path.join(stdlib, name) for name in _HIDDEN_STDLIB)
    libraries = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return (tuple(os.path.abspath(p) for p in hidden),
            tuple(os.path.join(os.path.abspath(p), "") for p in libraries))


def is_hidden(filename: str) -> bool:
    """A frame of streamlab, PySpark, Py4J or Python's threads, which the user does not see."""
    path = os.path.abspath(filename)
    return any(path == root or path.startswith(os.path.join(root, "")) for root in _roots()[0])


def is_user_code(filename: str, cells: Cells) -> bool:
    """A frame the user wrote: a cell, or a file that is neither ours nor a library's."""
    if os.path.basename(filename) in cells:
        return True
    if not filename.endswith(".py") or is_hidden(filename):  # "<frozen ...>", Cython's "index.pyx"
        return False
    return not os.path.abspath(filename).startswith(_roots()[1])


# ---------------------------------------------------------------------- exceptions
def first_line(exc: BaseException) -> str:
    """The first meaningful line of an exception's message: for an error that carries a Python
    traceback in its text (a Spark Python worker's), that traceback's last line."""
    text = str(exc).strip()
    if _PYTHON_TRACEBACK in text:
        tail = [line for line in text.split(_PYTHON_TRACEBACK)[-1].splitlines()
                if line.strip() and not line.startswith((" ", "\t"))]
        if tail:
            text = tail[-1]
    line = text.splitlines()[0].strip().rstrip(";") if text else ""  # Spark ends its first line with ";"
    return line if len(line) <= HEADLINE_MAX else line[:HEADLINE_MAX - 1] + "…"


def user_exception(exc: BaseException) -> BaseException:
    """The user's exception under streamlab's wrappers (a UserFunctionError raised from it)."""
    while isinstance(exc, UserFunctionError) and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def _innermost_user_frame(exc: BaseException, cells: Cells) -> Optional[traceback.FrameSummary]:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if is_user_code(f.filename, cells)]
    return frames[-1] if frames else None


def root_cause(exc: BaseException, cells: Cells) -> str:
    """The one line: the user's exception type and message, the operator, and the place."""
    root = user_exception(exc)
    if root is exc and isinstance(exc, UserFunctionError):
        return rewrite_sites(first_line(exc), cells)  # a check of what a function returned
    message = first_line(root)
    headline = f"{type(root).__name__}: {message}" if message else type(root).__name__
    frame = _innermost_user_frame(root, cells)
    place = site(frame.filename, frame.lineno, cells) if frame is not None else None
    if isinstance(exc, UserFunctionError) and exc.operator is not None:
        where = place or rewrite_sites(exc.call_site or "", cells)
        return f"{headline}, in operator '{exc.operator}' ({where})"
    if isinstance(exc, UserFunctionError):  # a wrapper that names its operator in its own words
        return rewrite_sites(first_line(exc), cells)
    return f"{headline}, at {place}" if place else headline


def user_traceback(exc: BaseException, cells: Cells) -> str:
    """The traceback of the user's exception (and what it was raised from) with hidden frames
    left out; "In [5], line 3" for frames in cells, with their line of code."""
    root = user_exception(exc)
    if root is exc and not isinstance(exc, UserFunctionError) \
            and _innermost_user_frame(exc, cells) is None:
        # nothing of the user's in it: a failure of streamlab itself, shown whole to be reported
        return "".join(traceback.format_exception(exc))
    out: list[str] = []
    _format(root, cells, out, set())
    return "".join(out)


def _format(exc: BaseException, cells: Cells, out: list[str], seen: set[int]) -> None:
    seen.add(id(exc))
    chained = exc.__cause__ if exc.__cause__ is not None else \
        None if exc.__suppress_context__ else exc.__context__
    # an exception a library raised and handled inside itself (pandas' KeyError under its
    # KeyError) says nothing of the user's code: the chain shows only the user's part
    if chained is not None and id(chained) not in seen and _innermost_user_frame(chained, cells) is not None:
        _format(chained, cells, out, seen)
        out.append("\nThe above exception was the direct cause of the following exception:\n\n"
                   if exc.__cause__ is not None else
                   "\nDuring handling of the above exception, another exception occurred:\n\n")
    frames = _frames(exc.__traceback__, cells)
    if frames:
        out.append(_PYTHON_TRACEBACK + "\n")
        out.extend(frames)
    out.extend(traceback.format_exception_only(type(exc), exc))


def _frames(tb: Optional[TracebackType], cells: Cells) -> list[str]:
    lines = []
    for frame in traceback.extract_tb(tb):
        if is_hidden(frame.filename):
            continue
        place = cell_site(frame.filename, frame.lineno, cells)
        code = frame.line
        if place is not None:
            source = cells[os.path.basename(frame.filename)].get("source", "").splitlines()
            code = source[frame.lineno - 1] if frame.lineno and 0 < frame.lineno <= len(source) else ""
        if place is None:
            place = f'File "{frame.filename}", line {frame.lineno}'
        lines.append(f"  {place}, in {frame.name}\n")
        if code and code.strip():
            lines.append(f"    {code.strip()}\n")
    return lines


def describe(exc: BaseException, cells: Cells) -> str:
    """A failed task's account of its exception: the root cause, a note if no restart can fix it,
    a blank line, the user's traceback."""
    why = restart_cannot_fix(exc)
    notes = (f"{NO_RESTART}{why}.",) if why else ()
    return Failure(root_cause(exc, cells), notes, user_traceback(exc, cells)).text()


# ---------------------------------------------------------------------- what a restart cannot fix
NO_RESTART = "No restart can fix this: "


def restart_cannot_fix(exc: BaseException) -> Optional[str]:
    """Why a failure with ``exc`` would fail again in every attempt (Flink's non-recoverable
    errors), or None: a module that cannot be imported, or an exception whose class says so
    (``restart_cannot_fix = True``: a configuration error, ...). The whole chain is looked at, since a
    user's exception is wrapped in the operator's."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ImportError):
            return f"{type(exc).__name__}: {exc}"
        if getattr(type(exc), "restart_cannot_fix", False):
            return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


def unrecoverable(text: str) -> Optional[str]:
    """What a job's failure text says no restart can fix (its note from ``describe``), or None."""
    return next((note[len(NO_RESTART):].rstrip(".") for note in Failure.parse(text).notes
                 if note.startswith(NO_RESTART)), None)


# ---------------------------------------------------------------------- the failure text
@dataclass(frozen=True)
class Failure:
    headline: str  # the root cause, one line
    notes: tuple[str, ...] = ()  # which task, whether the job restarts: one line each
    traceback: str = ""  # the user's traceback (may be empty)

    @classmethod
    def parse(cls, text: str) -> "Failure":
        head, _, rest = text.strip("\n").partition("\n\n")
        lines = head.splitlines() or [""]
        return cls(lines[0].strip(), tuple(line.strip() for line in lines[1:]), rest.strip("\n"))

    def text(self) -> str:
        head = "\n".join((self.headline, *self.notes))
        return f"{head}\n\n{self.traceback}" if self.traceback else head


def task_failed(error: str, task: str, task_manager: Optional[str]) -> str:
    """A job's failure from its failed task's account (``describe``) or a reason (a lost TaskManager)."""
    failure = Failure.parse(error)
    return Failure(failure.headline, (f"Task '{task}' failed on TaskManager {task_manager}.", *failure.notes),
                   failure.traceback).text()


def add_note(text: str, note: str) -> str:
    failure = Failure.parse(text)
    return Failure(failure.headline, (*failure.notes, note), failure.traceback).text()
