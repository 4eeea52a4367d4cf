"""Docker kinds: ``docker.network``, ``docker.volume``, ``docker.container``, ``docker.image``
and ``docker.job``, talking to the dockerd at ``GRAPHENE_DOCKER_HOST``.

Every object carries the labels ``graphene.record=<record id>`` (the marker create adopts
by, I4), ``graphene.scope=<installation>`` (what the orphan sweeper may touch),
``graphene.kind`` and ``graphene.spec`` (a hash of the spec it was made from). Names are
derived from the record, ``g-<name>-<first 8 of id>`` (images: ``graphene/<name>:<id8>``),
by the same functions the SDK uses (``graphene_sdk.libs.docker``), so a declaration can
name another record's object before it exists. See README.md in this directory.
"""

from kinds.docker.container import ContainerKind
from kinds.docker.image import ImageKind
from kinds.docker.job import JobKind
from kinds.docker.network import NetworkKind
from kinds.docker.volume import VolumeKind

__all__ = ["ContainerKind", "ImageKind", "JobKind", "NetworkKind", "VolumeKind"]
