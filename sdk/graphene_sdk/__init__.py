"""graphene_sdk: write pipelines as Python programs and drive Graphene from Python.

The names exported here are the SDK's contract (a test pins ``__all__``).
"""

from graphene_sdk._artifacts import ArtifactRef
from graphene_sdk._client import Client, RunHandle, RunInfo
from graphene_sdk._context import Context
from graphene_sdk._errors import (
    ChildRunFailed,
    ClientError,
    ConcurrencyLimit,
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
from graphene_sdk._pipeline import Pipeline, pipeline, registered
from graphene_sdk._runtime import Guarantee
from graphene_sdk._secrets import SecretRef

__all__ = [
    "Agent",
    "ArtifactRef",
    "Attached",
    "AttachedAgent",
    "ChildRunFailed",
    "Client",
    "ClientError",
    "ConcurrencyLimit",
    "Context",
    "ExecResult",
    "GrapheneError",
    "Guarantee",
    "Need",
    "NonDeterminismError",
    "OutcomeUnknown",
    "Pipeline",
    "PutFileResult",
    "RemoteError",
    "Resource",
    "ResourceFailed",
    "RunCancelled",
    "RunHandle",
    "RunInfo",
    "SecretRef",
    "StepFailed",
    "StepTimeout",
    "need",
    "pipeline",
    "registered",
]
