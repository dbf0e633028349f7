"""Which local address and interface reach a peer — so multi-host runs work on multi-homed hosts.

torch's defaults resolve the hostname, which on a multi-homed host (or inside a network namespace)
often names an address the peers cannot reach. Asking the kernel's routing table which source
address it would use towards the rendezvous host is the robust answer.
"""

from __future__ import annotations

import fcntl
import socket
import struct

from hetprof.errors import SpecError

SIOCGIFADDR = 0x8915


def parse_endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SpecError("command line", "--rdzv", "HOST:PORT with a port in 1..65535", text)
    return host.strip("[]"), int(port)


def route_source_addr(host: str, port: int) -> str:
    """The local IPv4 address the kernel would use to reach host:port (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError as exc:
        raise SpecError("command line", "--rdzv", "a host this machine has a route to", f"{host} ({exc})") from None


def interface_for_addr(addr: str) -> str | None:
    """The name of the interface holding IPv4 address `addr` (Linux), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            if socket.inet_ntoa(raw[20:24]) == addr:
                return name
    return None
