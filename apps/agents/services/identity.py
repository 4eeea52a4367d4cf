"""Identity: who an agent is, and how it proves it.

An agent is a record of kind ``agent``. ``agent_declare`` issues a single-use, short-lived
bootstrap token; the agent's first connect exchanges it for a long-lived credential. Only
SHA-256 digests are stored. A credential belongs to exactly one agent record; every refusal
(unknown, foreign, used, revoked, expired) is an ``error`` event on the agent record(s)
involved, and the connection is closed with a code from ``protocol``.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from django.conf import settings
from django.db import transaction
from graphene_agent import protocol

from apps.agents.choices import TokenKind
from apps.agents.models import Agent, AgentToken
from apps.agents.services.base import (
    AGENT_KIND,
    AgentRefused,
    _audit,
    _now,
    _record_event,
    _retired,
    agent_group,
)
from apps.agents.services.capabilities import needs_clean
from apps.core import audit
from apps.core.errors import Conflict, ValidationFailed
from apps.core.events import publish_on_commit
from apps.core.selectors import tls_ca_pem
from apps.records import services as records
from apps.records.choices import EventType, Phase
from apps.records.models import Record

logger = logging.getLogger(__name__)

BOOTSTRAP_PREFIX = "gab_"
CREDENTIAL_PREFIX = "gac_"


@dataclass(frozen=True)
class Authenticated:
    record_id: uuid.UUID
    credential: str | None  # only when a bootstrap token was exchanged
    # When the credential the connection rests on expires: the gateway closes it then.
    expires_at: datetime | None = None
    name: str = ""  # the agent record's name (the audit trail's name of the agent)


class AgentInstall(NamedTuple):
    """What ``agent_declare`` returns. ``bootstrap_token`` is a secret until it is used."""

    record: Record
    bootstrap_token: str
    install_script: str


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _token_create(record: Record, kind: TokenKind, prefix: str, *, now: datetime, expires_at: datetime | None) -> str:
    """A new token of ``kind`` for ``record``, returned once: only its digest is kept."""
    token = prefix + secrets.token_urlsafe(32)
    AgentToken.objects.create(
        agent=record,
        kind=kind,
        digest=_digest(token),
        prefix=token[:10],
        created_at=now,
        expires_at=expires_at,
    )
    return token


# --- declaration and install data --------------------------------------------------------------


def agent_declare(
    *,
    owner: Record,
    name: str,
    labels: dict[str, str] | None = None,
    actor: records.Actor = None,
    server_url: str | None = None,
    bootstrap_ttl: timedelta | None = None,
    needs: list[dict[str, Any]] | None = None,
) -> AgentInstall:
    """Declare an agent record under ``owner`` and issue install data for a machine.

    Re-declaring returns the same record (and a fresh bootstrap token: each one is single-use).
    The install script works as cloud-init user-data or over SSH: it downloads the zipapp from
    the server, checks its SHA-256, writes a 0600 env file and starts the agent.
    """
    from apps.agents.bundle import agent_bundle

    bundle = agent_bundle()  # built before the transaction: file work, not database work
    with transaction.atomic():
        record = agent_record_declare(owner=owner, name=name, labels=labels, actor=actor, needs=needs)
        token = agent_bootstrap_issue(record=record, ttl=bootstrap_ttl, actor=actor)
    script = agent_install_script(record=record, bootstrap_token=token, server_url=server_url, pyz_sha256=bundle.sha256)
    return AgentInstall(record=record, bootstrap_token=token, install_script=script)


@dataclass(frozen=True)
class AgentEnrollment:
    """What ``agent_enroll`` returns: the record, whether it is new, and the install data (each
    form holds the same single-use bootstrap token, a secret until the agent has used it)."""

    record: Record
    created: bool
    install_script: str
    cloud_config: str
    bootstrap_expires_at: datetime | None


# The owner of agents declared by hand (the API, graphenectl) when no owner is named: a root
# of their own, so that no run's or pipeline's death takes a standing machine with it.
STANDALONE_OWNER = "agents"


def agent_enroll(
    *,
    name: str,
    labels: dict[str, str] | None = None,
    owner: Record | None = None,
    namespace: str = "default",
    actor: records.Actor = None,
) -> AgentEnrollment:
    """Declare an agent for a machine that is installed by hand or by cloud-init (``agent_declare``)
    and return its install data: the install script and the same as ``#cloud-config``.

    Without ``owner`` the record belongs to the stand root ``agents`` of ``namespace`` (made when
    first needed); with one, it lives in the owner's namespace.
    Declaring it again returns the same record with a fresh bootstrap token. The token is only
    returned: no event, log line or journal entry holds it.
    """
    from apps.agents.install import render_cloud_config

    if owner is None:
        owner = records.record_ensure_root(kind="graphene.stand", name=STANDALONE_OWNER, namespace=namespace)
    existed = Record.objects.filter(parent=owner, kind=AGENT_KIND, name=name).exclude(phase=Phase.DELETED).exists()
    install = agent_declare(owner=owner, name=name, labels=labels, actor=actor)
    expires_at = (
        AgentToken.objects.filter(
            agent=install.record, kind=TokenKind.BOOTSTRAP, digest=_digest(install.bootstrap_token)
        )
        .values_list("expires_at", flat=True)
        .first()
    )
    return AgentEnrollment(
        record=install.record,
        created=not existed,
        install_script=install.install_script,
        cloud_config=render_cloud_config(install_script=install.install_script, agent_name=install.record.name),
        bootstrap_expires_at=expires_at,
    )


def agent_record_declare(
    *,
    owner: Record,
    name: str,
    labels: dict[str, str] | None = None,
    actor: records.Actor = None,
    needs: list[dict[str, Any]] | None = None,
) -> Record:
    """Declare the agent record under ``owner`` (idempotent) without issuing a token.

    For installs that issue their own token when they really install (``ssh_install``), so
    that a replayed declaration leaves no unused bootstrap token behind. With ``needs`` the
    record is ready only while its agent is connected *and* its machine publishes them.
    """
    spec = {"needs": needs_clean(needs)} if needs else {}
    with transaction.atomic():
        record = records.record_declare(kind=AGENT_KIND, name=name, owner=owner, spec=spec, labels=labels, actor=actor)
        Agent.objects.get_or_create(record=record)
    return record


def agent_bootstrap_issue(*, record: Record, ttl: timedelta | None = None, actor: records.Actor = None) -> str:
    """A new single-use bootstrap token for ``record`` (returned once; only its digest is kept);
    an ``agent.enroll`` row in the audit trail."""
    if record.kind != AGENT_KIND:
        raise ValidationFailed(f"{record} is not an agent record", fields={"record": ["must be of kind agent"]})
    if record.phase == Phase.DELETED or record.deletion_requested_at is not None:
        raise Conflict(f"{record} ({record.pk}) is being deleted; it cannot be enrolled")
    ttl = ttl or timedelta(seconds=settings.GRAPHENE_AGENT_BOOTSTRAP_TTL_SECONDS)
    if ttl <= timedelta(0):
        raise ValidationFailed("the bootstrap token's lifetime must be positive", fields={"bootstrap_ttl": ["> 0"]})
    now = _now()
    with transaction.atomic():
        token = _token_create(record, TokenKind.BOOTSTRAP, BOOTSTRAP_PREFIX, now=now, expires_at=now + ttl)
        # The token is never in the row: only that one was issued, and until when.
        _audit("agent.enroll", record, actor=actor, after=_audited(record), expires_at=now + ttl)
    return token


def _audited(record: Record) -> dict[str, Any]:
    """What the audit trail's digests cover of an agent: its identity and declaration (never a token)."""
    return {
        "id": record.pk,
        "name": record.name,
        "namespace": record.namespace,
        "owner": record.parent_id,
        "labels": record.labels,
        "spec": record.spec,
    }


def agent_server_ca(*, server_url: str) -> str:
    """The server's CA for an agent's install data, as ``GRAPHENE_AGENT_SERVER_CA`` takes it: each
    certificate's DER in base64 (its PEM body on one line), comma-separated. Empty for a plain
    ``http://`` server, or one whose certificate comes from a CA the machines already trust."""
    if not server_url.startswith("https://"):
        return ""
    pem = tls_ca_pem()
    if not pem:
        return ""
    certs = x509.load_pem_x509_certificates(pem.encode())
    return ",".join(base64.b64encode(c.public_bytes(serialization.Encoding.DER)).decode() for c in certs)


def agent_env_file(*, record: Record, bootstrap_token: str, server_url: str | None = None) -> str:
    """The agent's config file (``KEY=VALUE``; install it with mode 0600: it holds the token).

    Over HTTPS it pins the server's CA (``GRAPHENE_AGENT_SERVER_CA``, ``apps.core.selectors.tls_ca_pem``):
    the agent refuses a server whose certificate that CA did not sign, before it sends anything."""
    server = server_url or settings.GRAPHENE_AGENT_SERVER_URL
    # k=v,k=v on one line: labels whose values would break that format stay on the record only.
    labels = ",".join(
        f"{k}={v}" for k, v in sorted(record.labels.items()) if not any(c in f"{k}{v}" for c in ",\n\r\x00")
    )
    lines = [
        "# graphene-agent configuration (keep it mode 0600: the bootstrap token is a secret until used)",
        f"GRAPHENE_AGENT_SERVER={server}",
        f"GRAPHENE_AGENT_ID={record.pk}",
        f"GRAPHENE_AGENT_BOOTSTRAP_TOKEN={bootstrap_token}",
    ]
    server_ca = agent_server_ca(server_url=server)
    if server_ca:
        lines.append(f"GRAPHENE_AGENT_SERVER_CA={server_ca}")
    if labels:
        lines.append(f"GRAPHENE_AGENT_LABELS={labels}")
    return "\n".join(lines) + "\n"


def agent_install_script(
    *, record: Record, bootstrap_token: str, server_url: str | None = None, pyz_sha256: str | None = None
) -> str:
    """A POSIX shell script (cloud-init user-data compatible) that installs and starts the agent."""
    from apps.agents.bundle import agent_bundle
    from apps.agents.install import render_install_script

    server = (server_url or settings.GRAPHENE_AGENT_SERVER_URL).rstrip("/")
    return render_install_script(
        server_url=server,
        server_ca=agent_server_ca(server_url=server),
        pyz_sha256=pyz_sha256 or agent_bundle().sha256,
        env_file=agent_env_file(record=record, bootstrap_token=bootstrap_token, server_url=server),
        agent_name=record.name,
    )


def agent_credentials_revoke(*, record: Record, reason: str = "revoked", actor: records.Actor = None) -> int:
    """Revoke every token of the agent and close its connection; it needs a new bootstrap."""
    now = _now()
    with transaction.atomic():
        live = AgentToken.objects.filter(agent=record, revoked_at__isnull=True)
        before = {"agent": record.pk, "live_tokens": sorted(live.values_list("pk", flat=True))}
        count = live.update(revoked_at=now, revoked_reason=reason[:120])
        _audit(
            "agent.credentials_revoke",
            record,
            actor=actor,
            before=before,
            after={"agent": record.pk, "live_tokens": []},
            revoked=count,
            reason=reason[:120],
        )
        _record_event(
            record.pk, EventType.ERROR, reason="CredentialsRevoked", message=f"{count} token(s) revoked: {reason}"
        )
        publish_on_commit(
            agent_group(record.pk),
            {"event": "agent.close", "code": protocol.CLOSE_REFUSED, "reason": f"the credential was revoked: {reason}"},
        )
    return count


# --- authentication ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Refusal:
    close_code: int
    reason: str
    message: str
    record_ids: tuple[Any, ...]
    data: dict[str, Any]


def agent_authenticate(
    *, agent_id: str, credential: str | None = None, bootstrap_token: str | None = None, peer: str = ""
) -> Authenticated:
    """Check what a connecting agent presents; exchange a bootstrap token for a credential.

    Raises ``AgentRefused`` (after committing an ``error`` event on the agent records
    involved) for anything but a valid, current token of the claimed agent.
    """
    try:
        claimed = uuid.UUID(str(agent_id))
    except ValueError:
        raise AgentRefused(
            f"agent_id {agent_id!r} is not a UUID", close_code=protocol.CLOSE_UNAUTHENTICATED, reason="BadAgentId"
        ) from None
    with transaction.atomic():
        outcome = _authenticate(claimed, credential, bootstrap_token, peer)
    if isinstance(outcome, _Refusal):
        with transaction.atomic():
            for record_id in outcome.record_ids:
                _record_event(
                    record_id, EventType.ERROR, reason=outcome.reason, message=outcome.message, data=outcome.data
                )
        logger.warning("agent %s from %s refused: %s", claimed, peer or "?", outcome.message)
        raise AgentRefused(outcome.message, close_code=outcome.close_code, reason=outcome.reason)
    return outcome


def _authenticate(
    claimed: uuid.UUID, credential: str | None, bootstrap_token: str | None, peer: str
) -> Authenticated | _Refusal:
    now = _now()
    kind = TokenKind.CREDENTIAL if credential else TokenKind.BOOTSTRAP
    secret = credential or bootstrap_token or ""
    noun = "credential" if kind == TokenKind.CREDENTIAL else "bootstrap token"
    claimed_ids = tuple(Record.objects.filter(pk=claimed, kind=AGENT_KIND).values_list("pk", flat=True))
    data: dict[str, Any] = {"peer": peer, "claimed_agent": str(claimed), "presented": noun}

    def refuse(code: int, reason: str, message: str, ids: tuple[Any, ...] = claimed_ids) -> _Refusal:
        return _Refusal(code, reason, message, ids, data)

    if not secret:
        return refuse(protocol.CLOSE_UNAUTHENTICATED, "NoCredential", "the agent presented no credential or token")
    token = AgentToken.objects.select_for_update().filter(digest=_digest(secret), kind=kind).first()
    if token is None:
        return refuse(protocol.CLOSE_UNAUTHENTICATED, "UnknownCredential", f"the {noun} presented is not known")
    data["token"] = token.prefix
    if token.agent_id != claimed:
        return refuse(
            protocol.CLOSE_REFUSED,
            "ForeignCredential",
            f"agent {claimed} presented a {noun} that belongs to agent {token.agent_id}",
            tuple({*claimed_ids, token.agent_id}),
        )
    record = Record.objects.get(pk=token.agent_id)
    if _retired(record):
        return refuse(protocol.CLOSE_DELETED, "AgentDeleted", f"agent {record.pk} is deleted or being deleted")
    if token.revoked_at is not None:
        why = f": {token.revoked_reason}" if token.revoked_reason else ""
        return refuse(protocol.CLOSE_REFUSED, f"{kind.title()}Revoked", f"the {noun} was revoked{why}")
    if token.expires_at is not None and token.expires_at <= now:
        return refuse(protocol.CLOSE_REFUSED, f"{kind.title()}Expired", f"the {noun} expired at {token.expires_at}")
    if kind == TokenKind.CREDENTIAL:
        AgentToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return Authenticated(record_id=record.pk, credential=None, expires_at=token.expires_at, name=record.name)
    if token.used_at is not None:
        return refuse(
            protocol.CLOSE_REFUSED,
            "BootstrapTokenReused",
            f"the bootstrap token was already exchanged at {token.used_at.isoformat()}; it is single-use",
        )
    # The exchange: this enrollment replaces any earlier one (a re-installed machine).
    live = AgentToken.objects.filter(agent=record, revoked_at__isnull=True)
    before = {"agent": record.pk, "live_tokens": sorted(live.values_list("pk", flat=True))}
    AgentToken.objects.filter(pk=token.pk).update(used_at=now, last_used_at=now)
    live.exclude(pk=token.pk).update(revoked_at=now, revoked_reason="replaced by a new enrollment")
    days = settings.GRAPHENE_AGENT_CREDENTIAL_TTL_DAYS
    expires_at = now + timedelta(days=days) if days > 0 else None
    issued = _token_create(record, TokenKind.CREDENTIAL, CREDENTIAL_PREFIX, now=now, expires_at=expires_at)
    _audit(
        "agent.bootstrap",
        record,
        actor=audit.who_agent(record.pk, record.name),  # the agent, proving who it is right now
        before=before,
        after={"agent": record.pk, "live_tokens": sorted(live.values_list("pk", flat=True))},
        peer=peer,
        credential_expires_at=expires_at,
    )
    return Authenticated(record_id=record.pk, credential=issued, expires_at=expires_at, name=record.name)


def agent_credential_expired(*, record_id: Any, expires_at: datetime) -> str:
    """A connected agent's credential reached its expiry: the gateway closes the connection (as
    a refusal: the agent stops until it is enrolled again), and the record says why. Returns
    the reason sent to the agent."""
    reason = f"the credential expired at {expires_at.isoformat()}"
    with transaction.atomic():
        _record_event(record_id, EventType.ERROR, reason="CredentialExpired", message=f"{reason}; connection closed")
    logger.warning("agent %s: %s; connection closed", record_id, reason)
    return reason
