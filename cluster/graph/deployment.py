"""TaskDeploymentDescriptor: everything a TaskManager needs to run one subtask.

Channels are named ``<job>/<attempt>/<edge>/<producer subtask>/<consumer subtask>`` so that
buffers and credits of an earlier attempt of the job can never reach a task of a later one.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional


def channel_id(job_id: str, attempt: int, edge: int, producer: int, consumer: int) -> str:
    return f"{job_id}/{attempt}/{edge}/{producer}/{consumer}"


def channel_origin(channel: str) -> tuple[int, int]:
    """The edge and the producer subtask of a channel (channel_id's)."""
    _, _, edge, producer, _ = channel.split("/")
    return int(edge), int(producer)


@dataclass(frozen=True)
class InputGateDescriptor:
    edge: int
    ship_strategy: str
    # one per producer subtask: (channel id, the producer TaskManager's data address)
    channels: list[tuple[str, str]]


@dataclass(frozen=True)
class OutputDescriptor:
    edge: int
    ship_strategy: str
    key: list[str]
    max_parallelism: int
    # one per consumer subtask: (channel id, the consumer TaskManager's data address)
    channels: list[tuple[str, str]]
    side_output: Optional[list[str]] = None  # [operator uid, tag]; None for the chain's main output


@dataclass(frozen=True)
class TaskDeploymentDescriptor:
    job_id: str
    job_name: str
    attempt: int
    execution_id: str
    allocation_id: str
    vertex: dict  # the JobVertex as a dict, operators included
    subtask: int
    inputs: list[InputGateDescriptor]
    outputs: list[OutputDescriptor]
    job_config: dict = field(default_factory=dict)
    result_address: Optional[str] = None
    # the checkpoint to start from: {"checkpoint_id", "directory", "operators": {uid: [handles]}}
    restore: Optional[dict] = None
    cells: dict = field(default_factory=dict)  # the job graph's notebook cells (cluster.common.failures)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TaskDeploymentDescriptor":
        return cls(
            job_id=d["job_id"], job_name=d["job_name"], attempt=d["attempt"],
            execution_id=d["execution_id"], allocation_id=d["allocation_id"], vertex=d["vertex"],
            subtask=d["subtask"],
            inputs=[InputGateDescriptor(i["edge"], i["ship_strategy"], [tuple(c) for c in i["channels"]])
                    for i in d["inputs"]],
            outputs=[OutputDescriptor(o["edge"], o["ship_strategy"], list(o["key"]), o["max_parallelism"],
                                      [tuple(c) for c in o["channels"]], o.get("side_output"))
                     for o in d["outputs"]],
            job_config=d.get("job_config", {}), result_address=d.get("result_address"),
            restore=d.get("restore"), cells=d.get("cells", {}),
        )
