"""The listening TCP sockets of a set of processes, from /proc (no psutil, no ``ss``): what
the loopback checks of a local Ray, a local cluster, a submitted job's head and the Serve app
read. Imported by those tests as ``net_listeners`` (tests/ is on ``sys.path`` through its
conftest)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from memprism_ray.cluster import head


def tree(pid: int) -> set[int]:
    """``pid`` and all its descendants."""
    out = {pid}
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        kids = []
    for k in kids:
        out |= tree(int(k))
    return out


def session_pids(*leaders: int) -> set[int]:
    """The running processes of the process groups and sessions ``leaders`` lead (a node
    started with ``start_new_session``: Ray's daemons outlive the command that started them)."""
    return {pid for leader in leaders for pid in head._session(leader)}


def decode(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address of /proc/net/tcp*: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_addr)
    return ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)))


def listeners(pids: set[int]) -> list[tuple[int, str, int]]:
    """``(pid, address, port)`` of every listening TCP socket owned by ``pids``."""
    owners = {inode: pid for pid in pids for inode in head._socket_inodes(pid)}
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and int(cols[9]) in owners:  # TCP_LISTEN
                addr, port = cols[1].split(":")
                found.append((owners[int(cols[9])], str(decode(addr)), int(port, 16)))
    return found


def loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"
