"""Facts about the machine, sent in the hello: what selectors and people need to pick a machine."""

from __future__ import annotations

import fcntl
import ipaddress
import os
import platform
import socket
import struct
import sys
from pathlib import Path
from typing import Any

from graphene_agent import __version__

SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def _os_release() -> dict[str, str]:
    for candidate in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            text = Path(candidate).read_text()
        except OSError:
            continue
        values: dict[str, str] = {}
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip().strip('"')
        return values
    return {}


def memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def _ipv4(interface: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("256s", interface.encode()[:15])
        try:
            answer = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, request)
        except OSError:
            return None
    return socket.inet_ntoa(answer[20:24])


def addresses() -> list[dict[str, str]]:
    """Every interface address except loopback and link-local (read locally: no sockets opened to anyone)."""
    found: list[dict[str, str]] = []
    try:
        interfaces = [name for _index, name in socket.if_nameindex()]
    except OSError:
        interfaces = []
    for name in interfaces:
        address = _ipv4(name)
        if address and not ipaddress.ip_address(address).is_loopback:
            found.append({"interface": name, "address": address})
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            fields = line.split()
            if len(fields) < 6:
                continue
            raw = fields[0]
            ip = ipaddress.ip_address(":".join(raw[i : i + 4] for i in range(0, 32, 4)))
            if not (ip.is_loopback or ip.is_link_local):
                found.append({"interface": fields[5], "address": str(ip)})
    except OSError:
        pass
    if not found:  # not Linux: the resolver's view of our own name
        try:
            for info in socket.getaddrinfo(socket.gethostname(), None):
                address = str(info[4][0])
                if not ipaddress.ip_address(address.split("%")[0]).is_loopback:
                    entry = {"interface": "", "address": address}
                    if entry not in found:
                        found.append(entry)
        except OSError:
            pass
    return found


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def collect(labels: dict[str, str]) -> dict[str, Any]:
    release = _os_release()
    uname = platform.uname()
    return {
        "hostname": socket.gethostname(),
        "fqdn": socket.getfqdn(),
        "os": uname.system.lower(),
        "os_release": uname.release,
        "distribution": release.get("PRETTY_NAME", ""),
        "arch": uname.machine,
        "cpus": os.cpu_count() or 0,
        "memory_bytes": memory_bytes(),
        "addresses": addresses(),
        "labels": dict(labels),
        "agent_version": __version__,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "boot_id": boot_id(),
        "uid": os.getuid() if hasattr(os, "getuid") else None,
    }
