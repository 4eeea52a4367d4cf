"""graphene_sdk: write pipelines as Python programs and drive Graphene from Python.

The names exported here are the SDK's contract (a test pins ``__all__``). They are imported
on first use (PEP 562), so that importing ``graphene_sdk.config`` or the errors, as
graphenectl does on every start, does not load pydantic and the pipeline machinery.
"""

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from graphene_sdk._artifacts import (
        ArtifactRef,
    )
    from graphene_sdk._client import (
        Client,
        RunHandle,
    )
    from graphene_sdk._context import (
        Context,
    )
    from graphene_sdk._handles import (
        Agent,
        Attached,
        AttachedAgent,
        ExecResult,
        Need,
        PutFileResult,
        Resource,
        need,
    )
    from graphene_sdk._http import (
        Page,
        Paged,
    )
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
    from graphene_sdk._pipeline import (
        Pipeline,
        pipeline,
        registered,
    )
    from graphene_sdk._runtime import (
        Guarantee,
    )
    from graphene_sdk._secrets import (
        SecretRef,
    )
    from graphene_sdk._triggers import (
        UpstreamRun,
        cron,
        upstream,
        webhook,
    )

# Where each lazily imported name lives.
_LAZY = {
    "ArtifactRef": "graphene_sdk._artifacts",
    "Client": "graphene_sdk._client",
    "RunHandle": "graphene_sdk._client",
    "Context": "graphene_sdk._context",
    "Agent": "graphene_sdk._handles",
    "Attached": "graphene_sdk._handles",
    "AttachedAgent": "graphene_sdk._handles",
    "ExecResult": "graphene_sdk._handles",
    "Need": "graphene_sdk._handles",
    "PutFileResult": "graphene_sdk._handles",
    "Resource": "graphene_sdk._handles",
    "need": "graphene_sdk._handles",
    "Page": "graphene_sdk._http",
    "Paged": "graphene_sdk._http",
    "ArtifactInfo": "graphene_sdk._models",
    "JournalEntry": "graphene_sdk._models",
    "LogLine": "graphene_sdk._models",
    "OwnerRef": "graphene_sdk._models",
    "RecordEvent": "graphene_sdk._models",
    "RecordInfo": "graphene_sdk._models",
    "RunEvent": "graphene_sdk._models",
    "RunInfo": "graphene_sdk._models",
    "StandHolding": "graphene_sdk._models",
    "StandInfo": "graphene_sdk._models",
    "StandSummary": "graphene_sdk._models",
    "TreeNode": "graphene_sdk._models",
    "Pipeline": "graphene_sdk._pipeline",
    "pipeline": "graphene_sdk._pipeline",
    "registered": "graphene_sdk._pipeline",
    "Guarantee": "graphene_sdk._runtime",
    "SecretRef": "graphene_sdk._secrets",
    "UpstreamRun": "graphene_sdk._triggers",
    "cron": "graphene_sdk._triggers",
    "upstream": "graphene_sdk._triggers",
    "webhook": "graphene_sdk._triggers",
}

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
    "UpstreamRun",
    "cron",
    "need",
    "pipeline",
    "registered",
    "upstream",
    "webhook",
]

if not TYPE_CHECKING:  # a module __getattr__ seen by mypy would type every unknown name as valid

    def __getattr__(name: str) -> object:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'graphene_sdk' has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # later lookups find it without coming here
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
