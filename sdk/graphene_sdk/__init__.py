"""graphene_sdk: write pipelines as Python programs and drive Graphene from Python.

The names exported here are the SDK's contract (a test pins ``__all__``).
"""

from graphene_sdk._client import Client, RunHandle, RunInfo
from graphene_sdk._context import Agent, Attached, Context, ExecResult, Guarantee, Resource
from graphene_sdk._errors import (
    ChildRunFailed,
    ClientError,
    ConcurrencyLimit,
    GrapheneError,
    NonDeterminismError,
    OutcomeUnknown,
    ResourceFailed,
    RunCancelled,
    StepFailed,
    StepTimeout,
)
from graphene_sdk._pipeline import Pipeline, pipeline, registered
from graphene_sdk._secrets import SecretRef

__all__ = [
    "Agent",
    "Attached",
    "ChildRunFailed",
    "Client",
    "ClientError",
    "ConcurrencyLimit",
    "Context",
    "ExecResult",
    "GrapheneError",
    "Guarantee",
    "NonDeterminismError",
    "OutcomeUnknown",
    "Pipeline",
    "Resource",
    "ResourceFailed",
    "RunCancelled",
    "RunHandle",
    "RunInfo",
    "SecretRef",
    "StepFailed",
    "StepTimeout",
    "pipeline",
    "registered",
]
