"""graphene_sdk: write pipelines as Python programs and drive Graphene from Python.

The names exported here are the SDK's contract (a test pins ``__all__``).
"""

from graphene_sdk._artifacts import ArtifactRef
from graphene_sdk._client import Client, RunHandle
from graphene_sdk._context import Context
from graphene_sdk._errors import (
    ChildRunFailed,
    ClientError,
    ConcurrencyLimit,
    ConfigError,
    GrapheneError,
    NonDeterminismError,
    OutcomeUnknown,
    RemoteError,
    ResourceFailed,
    RunCancelled,
    StepFailed,
    StepTimeout,
)
from graphene_sdk._handles import Agent, Attached, AttachedAgent, ExecResult, Need, PutFileResult, Resource, need
from graphene_sdk._http import Page, Paged
from graphene_sdk._models import (
    ArtifactInfo,
    JournalEntry,
    LogLine,
    OwnerRef,
    RecordEvent,
    RecordInfo,
    RunEvent,
    RunInfo,
    StandHolding,
    StandInfo,
    StandSummary,
    TreeNode,
)
from graphene_sdk._pipeline import Pipeline, pipeline, registered
from graphene_sdk._runtime import Guarantee
from graphene_sdk._secrets import SecretRef

__all__ = [
    "Agent",
    "ArtifactInfo",
    "ArtifactRef",
    "Attached",
    "AttachedAgent",
    "ChildRunFailed",
    "Client",
    "ClientError",
    "ConcurrencyLimit",
    "ConfigError",
    "Context",
    "ExecResult",
    "GrapheneError",
    "Guarantee",
    "JournalEntry",
    "LogLine",
    "Need",
    "NonDeterminismError",
    "OutcomeUnknown",
    "OwnerRef",
    "Page",
    "Paged",
    "Pipeline",
    "PutFileResult",
    "RecordEvent",
    "RecordInfo",
    "RemoteError",
    "Resource",
    "ResourceFailed",
    "RunCancelled",
    "RunEvent",
    "RunHandle",
    "RunInfo",
    "SecretRef",
    "StandHolding",
    "StandInfo",
    "StandSummary",
    "StepFailed",
    "StepTimeout",
    "TreeNode",
    "need",
    "pipeline",
    "registered",
]
