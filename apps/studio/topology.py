"""Where a tree's records live, laid out for an SVG: one column per machine (the server's own
engine and file system first, then each agent by name), each holding its Docker networks with
the containers on them, then the machine's other records. The layout depends only on the
records (sorted by kind, name and id), so the same tree draws the same picture every time."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

AGENT_KIND = "agent"
NETWORK_KIND = "docker.network"
SERVER = "server"

COLUMN_WIDTH = 280
COLUMN_GAP = 30
ROW = 26
HEADER = 34
PAD = 10


@dataclass(frozen=True)
class Box:
    """A rectangle of the picture; ``record_id`` makes it a link to the record's inspector."""

    x: int
    y: int
    width: int
    height: int
    label: str
    role: str  # machine, network, record
    phase: str = ""
    record_id: str = ""


@dataclass
class _Machine:
    key: str
    label: str
    record: Any = None
    networks: dict[str, tuple[str, Any]] = field(default_factory=dict)  # docker name -> (label, record)
    on_network: dict[str, list[Any]] = field(default_factory=dict)
    others: list[Any] = field(default_factory=list)


def _order(record: Any) -> tuple[str, str, str]:
    return (str(record.kind), str(record.name), str(record.pk))


def _label(record: Any) -> str:
    return f"{record.kind}/{record.name}"


def layout(records: Iterable[Any], agent_names: dict[str, str]) -> tuple[list[Box], int, int]:
    """Boxes for ``records`` (with ``kind``, ``name``, ``pk``, ``phase``, ``spec``, ``outputs``),
    and the picture's width and height. ``agent_names``: agent record id -> name, for agents
    the records live on that are not themselves in the tree."""
    records = sorted(records, key=_order)
    machines: dict[str, _Machine] = {SERVER: _Machine(SERVER, "this server")}

    def machine(agent_id: Any) -> _Machine:
        key = str(agent_id) if agent_id else SERVER
        if key not in machines:
            machines[key] = _Machine(key, f"agent/{agent_names.get(key, key[:8])}")
        return machines[key]

    for record in records:
        if record.kind == AGENT_KIND:
            machine(record.pk).record = record
            machines[str(record.pk)].label = _label(record)
    for record in records:
        if record.kind == NETWORK_KIND:
            name = str((record.outputs or {}).get("name") or "")
            place = machine((record.spec or {}).get("agent"))
            place.networks[name or f"(not created) {record.name}"] = (_label(record), record)
    for record in records:
        if record.kind in (AGENT_KIND, NETWORK_KIND):
            continue
        spec = record.spec or {}
        place = machine(spec.get("agent"))
        network = spec.get("network")
        if isinstance(network, str) and network:
            place.on_network.setdefault(network, []).append(record)
        else:
            place.others.append(record)

    order = [machines[SERVER], *sorted((m for k, m in machines.items() if k != SERVER), key=lambda m: m.label)]
    order = [m for m in order if m.key != SERVER or m.networks or m.on_network or m.others]
    boxes: list[Box] = []
    height = 0
    for index, place in enumerate(order):
        x = index * (COLUMN_WIDTH + COLUMN_GAP)
        inner: list[Box] = []
        y = HEADER + PAD
        names = sorted(set(place.networks) | set(place.on_network))
        for name in names:
            label, network = place.networks.get(name, (f"network {name}", None))
            members = place.on_network.get(name, [])
            top = y
            y += ROW + 4
            for member in members:
                inner.append(_record_box(member, x + 2 * PAD, y, COLUMN_WIDTH - 4 * PAD))
                y += ROW + 4
            inner.insert(
                len(inner) - len(members),
                Box(
                    x + PAD,
                    top,
                    COLUMN_WIDTH - 2 * PAD,
                    y - top + PAD // 2,
                    label,
                    "network",
                    phase=str(network.phase) if network is not None else "",
                    record_id=str(network.pk) if network is not None else "",
                ),
            )
            y += PAD
        for record in place.others:
            inner.append(_record_box(record, x + PAD, y, COLUMN_WIDTH - 2 * PAD))
            y += ROW + 4
        column_height = y + PAD
        head = place.record
        boxes.append(
            Box(
                x,
                0,
                COLUMN_WIDTH,
                column_height,
                place.label,
                "machine",
                phase=str(head.phase) if head is not None else "",
                record_id=str(head.pk) if head is not None else "",
            )
        )
        boxes.extend(inner)
        height = max(height, column_height)
    width = max(len(order) * (COLUMN_WIDTH + COLUMN_GAP) - COLUMN_GAP, COLUMN_WIDTH)
    return boxes, width, max(height, HEADER + PAD)


def _record_box(record: Any, x: int, y: int, width: int) -> Box:
    return Box(x, y, width, ROW, _label(record), "record", phase=str(record.phase), record_id=str(record.pk))
