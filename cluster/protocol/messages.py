"""Every message that crosses a process boundary, one frozen dataclass each.

This module is the protocol's index: a reader finds here every ``op`` that any endpoint sends or
handles, by the conversation it belongs to (one module each). Names follow Flink's gateways
(JobMasterGateway, TaskExecutorGateway, ResourceManagerGateway, DispatcherGateway) and, for the
data plane, Flink's NettyMessage. What a message is (its registry by ``op``, the field checks of
``Message.from_wire``) is cluster.protocol.message_base.

Importing this module registers every message type, so a process that decodes through it (the
codec does) knows every op; callers reach the types here (``messages.SubmitJob``).
"""
from cluster.protocol.message_base import Acknowledge, ErrorResponse, MalformedMessage, Message
from cluster.protocol.dispatcher_messages import (SubmitJob, JobSubmitted, RequestJobStatus, JobStatus,
                                                  ListJobs, JobList, CancelJob, RequestClusterOverview,
                                                  ClusterOverview, RequestJobDetails, JobDetails,
                                                  TriggerSavepoint, SavepointCompleted, DisposeSavepoint,
                                                  RequestKeyedState, KeyedState, AcknowledgeCollect,
                                                  ShutdownCluster)
from cluster.protocol.task_executor_messages import (RegisterTaskManager, RegistrationSuccess,
                                                     RegistrationRejected, HeartbeatFromTaskManager,
                                                     HeartbeatFromResourceManager, RequestRegistration,
                                                     DisconnectTaskManager, RequestSlot, ShutdownTaskManager,
                                                     OfferSlots, FreeSlot, SubmitTask, CancelTask,
                                                     UpdateTaskExecutionState)
from cluster.protocol.checkpoint_messages import (TriggerCheckpoint, AcknowledgeCheckpoint, DeclineCheckpoint,
                                                  NotifyCheckpointComplete, NotifyCheckpointAborted,
                                                  EndOfInput)
from cluster.protocol.data_plane_messages import (BufferResponse, AddCredit, EndOfPartition,
                                                  CheckpointBarrier, Watermark, WatermarkStatus, CollectBatch,
                                                  CollectBarrier, CollectEnd)
from cluster.protocol.event_messages import (JobStatusChanged, JobSummaryUpdated, ClusterOverviewChanged,
                                             EventsHeartbeat, RequestJobSnapshot, JobSnapshot,
                                             RequestControlStats, ControlStats)
