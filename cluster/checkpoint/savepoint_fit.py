"""How a savepoint's state meets a job's operators, matched by uid (as Flink's): what the
scheduler restores from, and what a client checks before it upgrades a job (kernel_runtime's
%%stream upgrade) without asking the cluster."""
from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class SavepointFit:
    """How a savepoint's state meets a job's operators, matched by uid (as Flink's)."""

    kept: list[OperatorSpec]             # find their state in it
    empty: list[OperatorSpec]            # stateful operators of the job that start without state
    unclaimed: dict[str, dict]           # uid -> entry: state of operators the job does not have
    changed: list[tuple[OperatorSpec, dict]]  # same uid, another kind of operator (another state)

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
    return SavepointFit(kept, empty, {uid: e for uid, e in saved.items() if uid not in uids}, changed)
