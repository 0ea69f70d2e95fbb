"""A named ``%%stream`` cell run again is that job, edited: the running job of its name stops with
a savepoint and the edited pipeline starts from it (Flink's stop-with-savepoint, then a submission
with ``execution.savepoint.path``), each operator finding the state of the operator of its uid.

Before the old job stops, its state (a savepoint taken while it runs) is checked against the edited
pipeline: an upgrade that would be refused leaves the old job running. An upgrade whose new job
the cluster refuses all the same (a storage this kernel does not see, a failure at the start)
leaves the old job stopped and its state in the savepoint: kept here, the next run of the cell
starts from it.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Optional

from cluster.checkpoint.savepoint_fit import SavepointFit, fit_at, saved_operator, upgrade_preview
from cluster.protocol.states import JobState
from cluster.graph.job_graph import JobGraph, OperatorSpec
from cluster.protocol.endpoint import RpcError

from kernel_runtime.client.job_client import JobClient


@dataclass(frozen=True)
class Upgrade:
    """A job of the cell's name stopped with a savepoint, for the edited pipeline to start from."""

    name: str
    old_job_id: str
    location: str

    def graph(self, graph: JobGraph, allow_non_restored_state: bool) -> JobGraph:
        return dataclasses.replace(graph, config={**graph.config, "execution.savepoint.path": self.location,
                                                  "execution.savepoint.ignore-unclaimed-state": allow_non_restored_state})

    def failure(self, exc: BaseException) -> str:
        return (f"The upgrade of job {self.name!r} failed: {type(exc).__name__}: {exc}\n"
                f"The old job ({self.old_job_id}) is stopped and its state is in the savepoint {self.location}: "
                "re-run this cell with --allow-non-restored-state to start from it without the state that fits "
                "no operator, or with --restart to start from nothing.")

    def report(self, graph: JobGraph) -> list[str]:
        """What the cell prints: the savepoint, and which operators kept their state and which
        started empty (from the savepoint's metadata, if this machine sees it)."""
        lines = [f"Upgraded job {self.name!r}: job {self.old_job_id} stopped with savepoint {self.location}; "
                 f"job {graph.job_id} starts from it."]
        try:
            fit = fit_at(self.location, graph)
        except (OSError, ValueError) as exc:  # a cluster whose storage this kernel does not see
            return lines + [f"  (which operators kept their state is not known here: {exc})"]
        return lines + upgrade_lines(fit)


def upgrade_lines(fit: SavepointFit) -> list[str]:
    def names(specs: list[OperatorSpec]) -> str:
        return ", ".join(repr(o.name) for o in specs) or "none"
    lines = [f"  kept their state: {names(fit.kept)}", f"  started empty: {names(fit.empty)}"]
    left_out = [saved_operator(uid, e) for uid, e in sorted(fit.unclaimed.items())]
    left_out += [saved_operator(spec.uid, e) + f" ({e['kind']}, now {spec.kind})" for spec, e in fit.changed]
    if left_out:
        lines.append("  state left out (--allow-non-restored-state): " + ", ".join(left_out))
    return lines


class UpgradeRefused(ValueError):
    """The edited pipeline does not fit the running job's state; the job runs on."""


def _check_fit(client: JobClient, name: str, job_id: str, graph: JobGraph) -> None:
    """UpgradeRefused if the running job's state (a savepoint taken while it runs, then disposed
    of) does not fit ``graph``. Where this kernel does not see the cluster's storage, the
    cluster checks the fit when the new job starts, as before."""
    try:
        probe = client.trigger_savepoint(job_id, stop=False)
    except (RpcError, TimeoutError):
        return  # stopping it with a savepoint says what failed
    try:
        fit = fit_at(probe, graph)
    except (OSError, ValueError):
        return
    finally:
        try:
            client.dispose_savepoint(probe)
        except (RpcError, TimeoutError):
            pass  # a savepoint left behind costs disk, not correctness
    if fit.misfits:
        raise UpgradeRefused(f"cannot upgrade job {name!r} ({job_id}): the edited pipeline does not fit its "
                             f"state: {fit.refusal()}. The job runs on; --restart replaces it without its state.")


def _preview_at(location: str, graph: JobGraph, allow_non_restored_state: bool) -> tuple[list[dict], str]:
    try:
        rows, refusal = upgrade_preview(location, graph, allow_non_restored_state)
    except OSError as exc:  # a cluster whose storage this kernel does not see
        raise ValueError(f"no preview: the savepoint {location} is not readable here ({exc})") from None
    if refusal is not None:
        return rows, f"The upgrade would be refused, and the job would run on: {refusal}."
    return rows, "The upgrade would stop the job with a savepoint and start this pipeline from it."


def _wait_ended(client: JobClient, job_id: str, timeout: float = 60.0) -> None:
    """Until the job is over (its slots are free for the job that replaces it)."""
    deadline = time.monotonic() + timeout
    while client.job_status(job_id).state not in JobState.GLOBALLY_TERMINAL:
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} did not end within {timeout:g} s of being stopped")
        time.sleep(0.1)


class JobUpgrades:
    """The upgrades of one kernel's named jobs, with those whose new job was refused. Called on
    the kernel's main thread, where cells run."""

    def __init__(self) -> None:
        # (cluster directory, job name) -> an upgrade whose new job was refused: its old job is
        # stopped and its state is in the savepoint, which the cell's next run starts from
        self._refused: dict[tuple[str, str], Upgrade] = {}

    def keep_refused(self, client: JobClient, name: str, upgrade: Upgrade) -> None:
        """Keep ``upgrade`` for the cell's next run (with --allow-non-restored-state, say)."""
        self._refused[(str(client.cluster.cluster_dir), name)] = upgrade

    def preview(self, client: JobClient, name: str, graph: JobGraph,
                allow_non_restored_state: bool) -> tuple[list[dict], str]:
        """What upgrading the running job of this name to ``graph`` would do with each operator's
        state (SavepointFit.preview), and a sentence on the whole, from a savepoint taken while it
        runs (then disposed of), or from that of an upgrade whose new job was refused. Stops nothing."""
        running = self._running(client, name)
        pending = self._refused.get((str(client.cluster.cluster_dir), name))
        if not running:
            if pending is None:
                raise ValueError(f"no job named {name!r} runs on the cluster: there is nothing to upgrade "
                                 "(without --dry-run the cell starts it)")
            rows, verdict = _preview_at(pending.location, graph, allow_non_restored_state)
            return rows, f"From the savepoint {pending.location} of job {pending.old_job_id}. {verdict}"
        job_id = running[0]["jid"]
        probe = client.trigger_savepoint(job_id, stop=False)
        try:
            rows, verdict = _preview_at(probe, graph, allow_non_restored_state)
        finally:
            client.dispose_savepoint(probe)
        return rows, f"Job {name!r} ({job_id}) runs on. {verdict}"

    @staticmethod
    def _running(client: JobClient, name: str) -> list[dict]:
        running = [j for j in client.list_jobs()
                   if j["name"] == name and j["state"] not in JobState.GLOBALLY_TERMINAL]
        if len(running) > 1:
            raise ValueError(f"{len(running)} jobs named {name!r} run on the cluster ("
                             + ", ".join(j["jid"] for j in running) + "): cancel all but one to upgrade it")
        return running

    def replace_running(self, client: JobClient, name: str, restart: bool, graph: Optional[JobGraph] = None,
                        allow_non_restored_state: bool = False) -> Optional[Upgrade]:
        """The running job of this name on the client's cluster, if any, stopped with a savepoint
        (the upgrade to submit) or, with ``restart``, cancelled (None: start from nothing). The
        savepoint of an upgrade that failed is taken up again by the next run of the cell.

        Before it stops the job, the state of a savepoint taken while it runs is checked against
        ``graph``, the edited pipeline: an upgrade that would be refused raises UpgradeRefused and
        leaves the job running."""
        running = self._running(client, name)
        # a job of the name that runs now is newer than the savepoint of a refused upgrade
        pending = self._refused.pop((str(client.cluster.cluster_dir), name), None)
        if restart:
            for job in running:
                client.cancel(job["jid"])
                _wait_ended(client, job["jid"])
                print(f"Cancelled job {name!r} ({job['jid']}): this one starts from nothing (--restart).")
            return None
        if not running:
            return pending
        job_id = running[0]["jid"]
        if graph is not None and not allow_non_restored_state:
            _check_fit(client, name, job_id, graph)
        try:
            location = client.trigger_savepoint(job_id, stop=True)
        except (RpcError, TimeoutError) as exc:
            raise RpcError(f"cannot upgrade job {name!r} ({job_id}): stopping it with a savepoint failed: {exc}. "
                           "It runs on; --restart replaces it without its state") from None
        _wait_ended(client, job_id)
        return Upgrade(name, job_id, location)
