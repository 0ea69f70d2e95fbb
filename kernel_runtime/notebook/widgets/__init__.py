"""The live dashboard of a job: one component per view, fed by one listener (feed.JobFeed).

Importing this package is cheap; ipywidgets and Bokeh load with the Dashboard.
"""
from __future__ import annotations


def current_kernel():
    """The ipykernel this code runs in, or None (a script, a terminal IPython)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return getattr(get_ipython(), "kernel", None)


def in_kernel() -> bool:
    return current_kernel() is not None


def __getattr__(name: str):
    if name == "Dashboard":
        from kernel_runtime.notebook.widgets.dashboard import Dashboard
        return Dashboard
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Dashboard", "current_kernel", "in_kernel"]
