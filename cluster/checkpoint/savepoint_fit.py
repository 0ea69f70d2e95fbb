"""How a savepoint's state meets a job's operators, matched by uid (as Flink's): what the
scheduler restores from, and what a client checks before it upgrades a job (kernel_runtime's
%%stream upgrade) without asking the cluster."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from cluster.checkpoint.storage import local_path, read_metadata
from cluster.graph.job_graph import JobGraph, OperatorSpec
from cluster.graph.operator_kinds import KINDS


def restore_plan(body: dict, directory: str, is_savepoint: bool = False) -> dict:
    """What the tasks need from a checkpoint's metadata: every subtask's handles per operator,
    and on recovery the counters each vertex had (a job started from a savepoint is a new job:
    its counters start at zero, as Flink's do)."""
    return {"checkpoint_id": body["checkpoint_id"], "directory": str(directory),
            "operators": {uid: op["subtasks"] for uid, op in body["operators"].items()},
            "counters": {} if is_savepoint else body.get("counters", {})}


def saved_operator(uid: str, entry: dict) -> str:
    """An operator of a savepoint as a message names it: its name and uid (older savepoints
    carry no name: their vertex's)."""
    return f"operator '{entry.get('name') or entry.get('vertex', '?')}' (uid {uid})"


PREVIEW_COLUMNS = ["operator", "uid", "kind", "state"]  # a row of SavepointFit.preview
# the parameters that shape an operator's state (the aggregates it keeps, a window's function and
# assigner, a sliding window kept per slice): a checkpoint keeps them per operator, so that an
# upgrade's preview can say they changed
STATE_SHAPE = ("aggregations", "function", "assigner", "slices")


def state_shape(spec: OperatorSpec) -> dict:
    """What shapes ``spec``'s state, of STATE_SHAPE: those of its parameters it has."""
    return {name: spec.params[name] for name in STATE_SHAPE if spec.params.get(name) is not None}


def _shape_text(shape: dict) -> str:
    return "; ".join(f"{name} {value}" for name, value in sorted(shape.items())) or "none"


@dataclass(frozen=True)
class SavepointFit:
    """How a savepoint's state meets a job's operators, matched by uid (as Flink's)."""

    kept: list[OperatorSpec]             # find their state in it
    empty: list[OperatorSpec]            # stateful operators of the job that start without state
    unclaimed: dict[str, dict]           # uid -> entry: state of operators the job does not have
    changed: list[tuple[OperatorSpec, dict]]  # same uid, another kind of operator (another state)
    saved_keys: dict[str, list[str]] = field(default_factory=dict)  # uid -> key columns, where saved
    saved_shapes: dict[str, dict] = field(default_factory=dict)  # uid -> its state_shape, where saved

    @property
    def misfits(self) -> bool:
        return bool(self.unclaimed or self.changed)

    def refusal(self) -> str:
        problems = [f"it has state for {saved_operator(uid, e)}, which this job does not have"
                    for uid, e in sorted(self.unclaimed.items())]
        problems += [f"the state of {saved_operator(spec.uid, e)} is {e['kind']} state, and the job's operator "
                     f"'{spec.name}' of that uid is {spec.kind}" for spec, e in self.changed]
        return ("; ".join(problems) + ". Start without that state with execution.savepoint.ignore-unclaimed-state: "
                "true (--allow-non-restored-state), or give the operators the uids they had")

    def preview(self, specs: list[OperatorSpec], allow_non_restored_state: bool) -> list[dict]:
        """What starting ``specs`` (a job's operators, in order) from the savepoint does with each
        one's state, and with the savepoint's state that no operator takes: a row per operator,
        its ``state`` one of restored, started empty, dropped (left out, as
        --allow-non-restored-state allows), refused (the same, not allowed: the start fails) or
        no state (an operator that keeps none)."""
        kept, changed = {s.uid for s in self.kept}, {s.uid: e for s, e in self.changed}
        empty = {s.uid for s in self.empty}
        left_out = "dropped" if allow_non_restored_state else "refused"
        rows = []
        for spec in specs:
            if spec.uid in changed:
                state = f"started empty ({left_out}: its {changed[spec.uid]['kind']} state)"
            elif spec.uid in kept:
                state = "restored"
                was, now = self.saved_keys.get(spec.uid), list(spec.params.get("key") or [])
                if was is not None and was != now:  # older savepoints do not say
                    state += f" (its key was {', '.join(was) or 'none'}, now {', '.join(now) or 'none'})"
                shaped, shape = self.saved_shapes.get(spec.uid), state_shape(spec)
                if shaped is not None and shaped != shape:
                    state += f" (its state's schema was {_shape_text(shaped)}, now {_shape_text(shape)})"
            else:
                state = "started empty" if spec.uid in empty else "no state"
            rows.append({"operator": spec.name, "uid": spec.uid, "kind": spec.kind, "state": state})
        for uid, entry in sorted(self.unclaimed.items()):
            rows.append({"operator": entry.get("name") or entry.get("vertex", "?"), "uid": uid,
                         "kind": entry.get("kind", ""), "state": left_out})
        return rows

    def claimed_body(self, body: dict) -> dict:
        """The savepoint's metadata with only the state the job takes."""
        kept = {spec.uid for spec in self.kept}
        return dict(body, operators={uid: e for uid, e in body["operators"].items() if uid in kept})


def savepoint_fit(body: dict, job_graph: JobGraph) -> SavepointFit:
    specs = [o for v in job_graph.vertices for o in v.operators]
    saved: dict[str, dict] = body["operators"]
    kept, empty, changed = [], [], []
    for spec in specs:
        entry = saved.get(spec.uid)
        if entry is None:
            if KINDS[spec.kind].stateful:
                empty.append(spec)
        elif (entry.get("kind") or spec.kind) != spec.kind:  # older savepoints do not say: taken as is
            changed.append((spec, entry))
            empty.append(spec)
        else:
            kept.append(spec)
    uids = {spec.uid for spec in specs}
    keys = {uid: list(e["key"]) for uid, e in saved.items() if isinstance(e.get("key"), list)}
    shapes = {uid: e["shape"] for uid, e in saved.items() if isinstance(e.get("shape"), dict)}
    return SavepointFit(kept, empty, {uid: e for uid, e in saved.items() if uid not in uids}, changed, keys,
                        shapes)


def fit_at(location: str, job_graph: JobGraph) -> SavepointFit:
    """How the savepoint at ``location`` fits ``job_graph``; OSError or ValueError where this
    process does not see the savepoint's storage."""
    return savepoint_fit(read_metadata(Path(local_path(location))), job_graph)


def upgrade_preview(location: str, job_graph: JobGraph,
                    allow_non_restored_state: bool) -> tuple[list[dict], Optional[str]]:
    """What starting ``job_graph`` from the savepoint at ``location`` would do with each operator's
    state (SavepointFit.preview: a row of PREVIEW_COLUMNS each), and why the start would be
    refused, if it would; OSError or ValueError as fit_at."""
    fit = fit_at(location, job_graph)
    rows = fit.preview([o for v in job_graph.vertices for o in v.operators], allow_non_restored_state)
    return rows, fit.refusal() if fit.misfits and not allow_non_restored_state else None
