"""Two "hosts" on one machine: network namespaces joined by a veth pair, shaped with tc tbf.

The link suite's tests and benchmark need a real network path with a known bandwidth. Namespaces
give each side its own stack, `tc qdisc … tbf rate R` shapes both directions at the veth, and the
whole thing is torn down on exit — also after a failure or Ctrl-C. Names carry the pid so parallel
runs never collide, and only private addresses inside the namespaces are used: no traffic leaves
them. Needs root and iproute2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
from collections.abc import Iterator

SUBNET = "10.213.77"


def available() -> tuple[bool, str]:
    """(usable, why not) — for a skip reason."""
    if os.geteuid() != 0:
        return False, "needs root (ip netns, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"iproute2's `{tool}` is not installed"
    probe = f"hpprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return False, f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True, ""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _tc(ns: str, *args: str) -> None:
    done = subprocess.run(["ip", "netns", "exec", ns, "tc", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)} (in {ns}): {done.stderr.strip()}")


@dataclasses.dataclass(frozen=True)
class ShapedPair:
    ns: tuple[str, str]
    addr: tuple[str, str]
    dev: tuple[str, str]
    rate_bps: float  # configured rate in bits per second (layer 2, as tbf counts it)

    def shape(self, rate_mbit: float) -> ShapedPair:
        """Re-shape both directions to `rate_mbit` (tbf replaces the previous root qdisc)."""
        for ns, dev in zip(self.ns, self.dev, strict=True):
            _tc(ns, "qdisc", "replace", "dev", dev, "root", *tbf_args(rate_mbit))
        return dataclasses.replace(self, rate_bps=rate_mbit * 1e6)

    def argv(self, side: int, argv: list[str]) -> list[str]:
        """A command line that runs `argv` inside namespace `side`."""
        return ["ip", "netns", "exec", self.ns[side], *argv]


def tbf_args(rate_mbit: float) -> list[str]:
    """A token bucket that shapes accurately: burst of a few jumbo frames (≥ what the rate fills in a
    4 ms timer tick), and a queue of about 50 ms at that rate so TCP is not starved by drops."""
    rate_Bps = rate_mbit * 1e6 / 8
    burst = int(max(32 * 1024, rate_Bps * 0.004))
    limit = int(max(4 * burst, rate_Bps * 0.05))
    return ["tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst), "limit", str(limit)]


@contextlib.contextmanager
def shaped_pair(rate_mbit: float, mtu: int = 9000, tag: str = "") -> Iterator[ShapedPair]:
    """Two namespaces joined by a veth pair shaped at `rate_mbit` both ways; removed on exit."""
    pid = os.getpid()
    ns = (f"hp{tag}{pid}a", f"hp{tag}{pid}b")
    dev = (f"hpv{tag}{pid}a"[-15:], f"hpv{tag}{pid}b"[-15:])
    addr = (f"{SUBNET}.1", f"{SUBNET}.2")
    try:
        for n in ns:
            _ip("netns", "add", n)
        _ip("link", "add", dev[0], "netns", ns[0], "type", "veth", "peer", "name", dev[1], "netns", ns[1])
        for n, d, a in zip(ns, dev, addr, strict=True):
            _ip("-n", n, "link", "set", "lo", "up")
            _ip("-n", n, "link", "set", d, "mtu", str(mtu))
            _ip("-n", n, "addr", "add", f"{a}/24", "dev", d)
            _ip("-n", n, "link", "set", d, "up")
        yield ShapedPair(ns=ns, addr=addr, dev=dev, rate_bps=0.0).shape(rate_mbit)
    finally:
        for n in ns:  # deleting a namespace removes its end of the veth, and with it the pair
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
