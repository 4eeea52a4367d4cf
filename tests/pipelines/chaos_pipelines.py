"""The pipeline of the crash test (``tests/pipelines/test_chaos.py``).

Workers load it through ``GRAPHENE_PIPELINE_MODULES`` (the test starts them with it); the
test process imports it to start runs. Every real execution of a step appends one line
``<start time> <pid>`` to a file under the data directory, so the test can count
executions and tell whether a step ran again after its journal entry was completed.

The environment, 20 ``test.sleep`` records per run (three levels deep)::

    net, dns, zone-0, zone-1-<run>
    zone-Z ─ host-Z-H (H = 0, 1)
    host-Z-H ─ disk-Z-H-D (D = 0, 1, 2)

Once its zones are ready the run hands zone 1 and its subtree (9 records) to the pipeline's
stand for an hour; the rest dies with the run. The stand holds one live child per kind and
name, so the kept zone is named after the run (``zone_name``: ``<run>`` is the last 8
characters of the run id); hosts and disks are unique under their own parents.

Creation times are derived from the run id and the record's name (crc32, stable across
processes), so a replay declares exactly what the first execution did.
"""

from __future__ import annotations

import os
import time
import zlib
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from graphene_sdk import Context, OutcomeUnknown, Resource, pipeline
from pydantic import BaseModel, Field

ZONES = 2
HOSTS = 2
DISKS = 3
RECORDS = 2 + ZONES + ZONES * HOSTS + ZONES * HOSTS * DISKS  # net, dns + the zone tree = 20
KEPT_ZONE = 1  # handed to the stand with its subtree
KEPT = 1 + HOSTS + HOSTS * DISKS  # the kept zone, its hosts and their disks = 9
KEEP_FOR = timedelta(hours=1)


def zone_name(z: int, run_id: str) -> str:
    """Zone ``z``'s name; the kept one carries the run's: a stand refuses a second live zone-1.

    The tail of the id: random in a uuid4, and what tells apart the testing kit's sequential ids.
    """
    return f"zone-{z}-{run_id[-8:]}" if z == KEPT_ZONE else f"zone-{z}"


def effects_dir() -> Path:
    folder = Path(settings.DATA_DIR) / "chaos-effects"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def effects_file(run_id: str, step: str) -> Path:
    return effects_dir() / f"{run_id}-{step}"


def executions(run_id: str, step: str) -> list[tuple[float, int]]:
    """Every real execution of the step: (start time as time.time(), pid)."""
    path = effects_file(run_id, step)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        started, pid = line.split()
        rows.append((float(started), int(pid)))
    return rows


def _mark(run_id: str, step: str) -> None:
    # One short write with O_APPEND: concurrent executions never interleave within a line.
    line = f"{time.time():.6f} {os.getpid()}\n".encode()
    fd = os.open(effects_file(run_id, step), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


class ChaosInputs(BaseModel):
    min_create_ms: int = Field(default=50, ge=0)
    max_create_ms: int = Field(default=300, ge=0)
    delete_ms: int = Field(default=50, ge=0)
    step_ms: int = Field(default=200, ge=0)


class ChaosOutput(BaseModel):
    records: int
    objects: dict[str, str]
    steps: list[str]
    audit: str


def _ms(run_id: str, name: str, inputs: ChaosInputs) -> int:
    spread = max(inputs.max_create_ms - inputs.min_create_ms, 0) + 1
    return inputs.min_create_ms + zlib.crc32(f"{run_id}/{name}".encode()) % spread


def _work(run_id: str, step: str, ms: int, payload: str) -> str:
    _mark(run_id, step)
    time.sleep(ms / 1000)
    return payload


@pipeline("chaos.env", inputs=ChaosInputs)
def environment(ctx: Context, inputs: ChaosInputs) -> ChaosOutput:
    """Declare 20 records in a tree, wait on some, run checkpointed steps, sleep, delete one, keep 9."""
    run_id = ctx.run_id

    def declare(name: str, parent: Resource | None = None) -> Resource:
        spec = {"create_ms": _ms(run_id, name, inputs), "delete_ms": inputs.delete_ms, "value": name}
        return ctx.declare("test.sleep", name, spec, parent=parent)

    net = declare("net")
    dns = declare("dns")
    zones = [declare(zone_name(z, run_id)) for z in range(ZONES)]
    hosts = [declare(f"host-{z}-{h}", parent=zone) for z, zone in enumerate(zones) for h in range(HOSTS)]
    disks = [
        declare(f"disk-{host.name[5:]}-{d}", parent=host) for host in hosts for d in range(DISKS)
    ]  # fmt: skip
    objects: dict[str, str] = {}
    steps: list[str] = []

    objects["net"] = net.ready()["object"]
    steps.append(ctx.step("configure-net", _work, run_id, "configure-net", inputs.step_ms, "net"))

    objects["dns"] = dns.ready()["object"]
    ctx.log("dns is ready")
    dns.delete()  # deleted while the run goes on (children first: it has none)

    for host in hosts:
        objects[host.name] = host.ready()["object"]
        name = f"provision-{host.name}"
        ctx.log(f"provisioning {host.name}")  # a kill during the step must not write it twice
        steps.append(ctx.step(name, _work, run_id, name, inputs.step_ms, host.name))
    ctx.sleep(0.5)  # a durable timer between the two halves
    for disk in disks[::DISKS]:  # the first disk of each host
        objects[disk.name] = disk.ready()["object"]
    for zone in zones:
        objects[zone.name] = zone.ready()["object"]
    ctx.to_stand(zones[KEPT_ZONE], keep_for=KEEP_FOR)  # outlives the run, its disks ready or not

    try:
        audit = ctx.step(
            "audit", _work, run_id, "audit", inputs.step_ms, "audited", guarantee="at_most_once"
        )  # fmt: skip
    except OutcomeUnknown:
        audit = "unknown"
    return ChaosOutput(records=RECORDS, objects=objects, steps=steps, audit=audit)
