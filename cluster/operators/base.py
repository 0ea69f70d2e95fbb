"""What every operator is: a small object a task drives batch by batch.

Batches are ``pyarrow.Table``s. ``process`` returns the tables to pass on (possibly none);
``finish`` runs once when every input has ended and may flush what it held back. A source
instead answers ``poll``: a table, an empty table when nothing is ready yet, or None at its end.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

import cloudpickle
import pyarrow as pa

from cluster.conf import TaskConfig
from cluster.common.failures import UserFunctionError as UserFunctionError  # where operators have always found it
from cluster.graph.job_graph import OperatorSpec
from cluster.graph.operator_kinds import operator_kind, source_ends


@dataclass
class OperatorSnapshot:
    """An operator's part of a checkpoint: plain data for the metadata, and keyed state to write.

    ``keyed`` is the synchronous part of a state backend's snapshot; the task writes it to a file
    on another thread while processing goes on."""

    handle: dict
    keyed: Any = None


class TaskCancelled(Exception):
    """Raised inside a task thread when its task was cancelled; not a failure."""


@dataclass
class OperatorContext:
    job_id: str
    job_name: str
    attempt: int
    subtask: int
    parallelism: int
    max_parallelism: int
    config: TaskConfig
    result_address: Optional[str]
    cancelled: threading.Event
    sender: Any  # the task's ChannelSender, for operators that talk to the outside (collect sink)
    side_outputs: frozenset = frozenset()  # (operator uid, tag) pairs that some operator consumes
    emit_side: Callable[[str, str, pa.Table], None] = lambda uid, tag, table: None
    execution_id: str = ""
    task_name: str = ""
    restored_checkpoint: int = 0  # the checkpoint this attempt started from (0: none)
    set_detail: Callable[[str], None] = lambda detail: None  # what the task waits for, for the status
    # called on the task thread before a source waits for input: the task sends what its outputs hold
    before_idle: Callable[[], None] = lambda: None


# kind name -> the class that runs it, filled by ``class X(Operator, kind=...)``
OPERATORS: dict[str, type["Operator"]] = {}


class Operator:
    kind: Optional[str] = None  # the operator kind (cluster.graph.operator_kinds) this class runs

    def __init_subclass__(cls, kind: Optional[str] = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if kind is None:
            return  # a base of operators (SourceOperator, KeyedOperator), or a subclass of one
        operator_kind(kind)  # a KeyError unless the vocabulary declares the kind
        if kind in OPERATORS:
            raise TypeError(f"operator kind {kind!r} is run by both {OPERATORS[kind].__name__} and {cls.__name__}")
        cls.kind = kind
        OPERATORS[kind] = cls

    def __init__(self, spec: OperatorSpec, ctx: OperatorContext):
        self.spec = spec
        self.ctx = ctx
        self.params = spec.params
        self.udf: Optional[Callable] = cloudpickle.loads(spec.udf) if spec.udf is not None else None

    def open(self) -> None:
        pass

    def process(self, table: pa.Table) -> list[pa.Table]:
        return [table]

    def finish(self) -> list[pa.Table]:
        return []

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ time
    # Watermarks are epoch milliseconds: watermark t says no row of timestamp <= t is to come
    # (cluster.operators.windowing.watermarks). The task calls these on its thread, between batches.
    uses_processing_time = False  # the task calls on_processing_time only on operators that say so
    generates_watermarks = False  # the task asks periodic_watermark of these (timestamps-watermarks)

    def process_watermark(self, watermark: int) -> tuple[list[pa.Table], Optional[int]]:
        """The input watermark advanced to ``watermark``, after every row before it: the tables
        to pass on (windows it fired) and the watermark to pass on (None: none, as an operator that
        makes watermarks of its own)."""
        return [], watermark

    def on_processing_time(self, now_ms: int) -> list[pa.Table]:
        """Processing-time timers due at ``now_ms`` (wall clock, epoch ms): the tables they emit."""
        return []

    def periodic_watermark(self) -> Optional[tuple[int, bool]]:
        """(watermark, idle) for an operator that generates watermarks, asked every
        ``pipeline.auto-watermark-interval``; None if it has none to give yet."""
        return None

    def window_end_passed(self) -> bool:
        """For an operator that generates watermarks: whether its watermark should go out now,
        before the interval, because it passed the end of a window."""
        return False

    def process_side(self, side: int, table: pa.Table) -> list[pa.Table]:
        """A batch of a two-input operator (joins): ``side`` 0 is the left input, 1 the right."""
        raise TypeError(f"{self.spec.where()} has one input, not two")

    def metrics(self) -> dict:
        """Operator-specific figures added to the task's metrics."""
        return {}

    # ------------------------------------------------------------------ checkpoints
    def snapshot_state(self, checkpoint_id: int) -> Optional[OperatorSnapshot]:
        """Called on the task thread at the barrier; None for a stateless operator."""
        return None

    def restore_state(self, handles: list[dict]) -> None:
        """Called after open() with the handles of EVERY subtask of this operator in the restored
        checkpoint (each with "subtask" and "parallelism" of its writer), so an operator restored
        at another parallelism can pick what is now its own."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        pass

    def has_side_output(self, tag: str) -> bool:
        """Whether the job reads this operator's side output ``tag`` (else such rows are an error)."""
        return (self.spec.uid, tag) in self.ctx.side_outputs

    def side_output(self, tag: str, table: pa.Table) -> None:
        if table.num_rows:
            self.ctx.emit_side(self.spec.uid, tag, table)

    def call_user(self, *args):
        """Call the user's function; its exception is re-raised naming this operator."""
        if self.udf is None:
            raise TypeError(f"operator '{self.spec.name}' ({self.spec.kind}) has no user function to call")
        return self.call(self.udf, *args)

    def call(self, fn: Callable, *args):
        """Call one of the user's functions (the task's interrupt looks for this frame)."""
        try:
            return fn(*args)
        except TaskCancelled:
            raise
        except Exception as exc:
            raise UserFunctionError(f"{self.spec.where()} raised {type(exc).__name__}: {exc}",
                                    self.spec.name, self.spec.call_site) from exc


class SourceOperator(Operator):
    # the longest a poll may wait for input, set by the task before each poll: short while the
    # chain's Spark stage holds batches, whose outputs the task hands on between polls
    wait_limit_s = float("inf")

    def poll(self) -> Optional[pa.Table]:
        raise NotImplementedError

    def waiting(self, wanted_s: float) -> float:
        """How long a poll that would wait ``wanted_s`` for input may wait. Every source's wait
        for input passes here, so that what the task's outputs hold leaves before the task idles
        (``ctx.before_idle``): a row waits for the buffer timeout only while its task is busy."""
        if wanted_s > 0:
            self.ctx.before_idle()
        return min(wanted_s, self.wait_limit_s)

    def snapshot_position(self) -> dict:
        """Where this subtask is in its input: all that replay from a checkpoint needs."""
        raise NotImplementedError

    def restore_position(self, position: dict) -> None:
        raise NotImplementedError

    def snapshot_state(self, checkpoint_id: int) -> Optional[OperatorSnapshot]:
        return OperatorSnapshot({"position": self.snapshot_position()})

    def restore_state(self, handles: list[dict]) -> None:
        """A source's position belongs to its subtask; sources that can be rescaled override this."""
        if len(handles) != self.ctx.parallelism:
            raise ValueError(f"{self.spec.where()}: its position was saved at parallelism {len(handles)} and "
                             f"this source cannot be rescaled to {self.ctx.parallelism}")
        self.restore_position(next(h["position"] for h in handles if h["subtask"] == self.ctx.subtask))

    @property
    def is_bounded(self) -> bool:
        """Whether this source ends, as its kind declares it (cluster.graph.operator_kinds)."""
        return source_ends(self.spec.kind, self.params)
