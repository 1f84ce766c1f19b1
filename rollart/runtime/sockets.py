"""Listening TCP sockets of this machine and the processes holding them (Linux ``/proc``,
no ``ss``/psutil needed): how the tests check that a run listens on loopback only."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from rollart.runtime.procs import pids

_LISTEN = "0A"


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    pids: tuple[int, ...]
    names: tuple[str, ...]

    @property
    def loopback(self) -> bool:
        return is_loopback_host(self.address)


def is_loopback_host(host: str) -> bool:
    """``localhost``, or an IPv4/IPv6 loopback address (IPv4-mapped included); a name or a
    malformed address is not."""
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _addr(hex_addr: str, v6: bool) -> str:
    raw = bytes.fromhex(hex_addr)
    if not v6:
        return socket.inet_ntop(socket.AF_INET, struct.pack("<I", struct.unpack(">I", raw)[0]))
    words = struct.unpack(">4I", raw)
    return socket.inet_ntop(socket.AF_INET6, struct.pack("<4I", *words))


def _socket_owners() -> dict[int, set[int]]:
    owners: dict[int, set[int]] = {}
    for pid, path in pids():
        try:
            for fd in os.scandir(f"{path}/fd"):
                try:
                    target = os.readlink(fd.path)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    owners.setdefault(int(target[8:-1]), set()).add(pid)
        except OSError:
            continue
    return owners


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def listening() -> list[Listener]:
    """Every listening TCP socket (IPv4 and IPv6) with the pids that hold it."""
    owners = _socket_owners()
    out = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != _LISTEN:
                continue
            hex_ip, hex_port = f[1].split(":")
            pids = tuple(sorted(owners.get(int(f[9]), ())))
            out.append(Listener(_addr(hex_ip, v6), int(hex_port, 16), pids, tuple(_name(p) for p in pids)))
    return out
