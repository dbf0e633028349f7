"""Point-to-point links between hosts, measured under torchrun's rendezvous and fitted to α–β.

Each host runs `hetprof profile --suite link --nnodes N --node-rank R --rdzv HOST:PORT`. The
command starts one worker through torch's elastic launcher (`torch.distributed.launcher.api`) with
a c10d rendezvous hosted by rank 0 — the same machinery as `torchrun`, no protocol of our own. Each
host records the directions it sent (raw samples as `link.p2p` plus the fitted link), so N hosts'
databases merge into the whole fleet's links without duplicates.
"""

from __future__ import annotations

import logging
import os
import statistics

from hetprof.errors import ExecutionError, SpecError
from hetprof.profiler import netaddr
from hetprof.profiler.context import ProfileContext
from hetprof.profiler.link_worker import link_worker
from hetprof.profiler.registry import Suite, register_suite
from hetprof.safety.processes import isolated_children


def launch_config(ctx: ProfileContext):
    """The elastic-launch configuration this host joins the rendezvous with."""
    from torch.distributed.launcher.api import LaunchConfig

    o = ctx.options
    if not o.get("rdzv"):
        raise SpecError("command line", "--rdzv", "HOST:PORT of the rendezvous (rank 0's address)", None)
    host, port = netaddr.parse_endpoint(o["rdzv"])
    nnodes = int(o.get("nnodes") or 2)
    local_addr = o.get("local_addr") or netaddr.route_source_addr(host, port)
    return LaunchConfig(
        min_nodes=nnodes, max_nodes=nnodes, nproc_per_node=1, run_id=o.get("rdzv_id") or "hetprof-link",
        role="hetprof-link", rdzv_endpoint=f"{host}:{port}", rdzv_backend="c10d",
        # rank 0 hosts the c10d store; said explicitly because hostname matching fails on multi-homed
        # hosts and inside network namespaces
        rdzv_configs={"is_host": int(o.get("node_rank") or 0) == 0, "join_timeout": o.get("join_timeout", 300)},
        max_restarts=0, monitor_interval=0.1, start_method="spawn", local_addr=local_addr,
    ), local_addr


@register_suite
class LinkSuite(Suite):
    name = "link"
    scope = "cluster"
    default = False
    help = "host-to-host send/recv under torchrun's rendezvous, fitted to t(S) = alpha + S/beta"

    def run(self, ctx: ProfileContext) -> None:
        from torch.distributed.launcher.api import elastic_launch

        config, local_addr = launch_config(ctx)
        if "GLOO_SOCKET_IFNAME" not in os.environ:
            ifname = netaddr.interface_for_addr(local_addr)
            if ifname:  # the workers inherit it: gloo then talks over the interface that reaches the peers
                os.environ["GLOO_SOCKET_IFNAME"] = ifname
        logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
        spec = {"host": ctx.host, "region": ctx.options.get("region"),
                "per_region": bool(ctx.options.get("per_region")),
                "target_s": ctx.options.get("link_target_s") or (0.25 if ctx.quick else 0.4),
                "repeats": 3 if ctx.quick else 5, "sizes": 5 if ctx.quick else 8}
        try:
            with isolated_children():  # the worker starts isolated from the current folder
                results = elastic_launch(config, link_worker)(spec)
        except Exception as exc:  # ChildFailedError, RendezvousTimeoutError, ...
            raise ExecutionError(f"link suite: the rendezvous at {config.rdzv_endpoint} or a worker failed "
                                 f"({type(exc).__name__}: {exc})") from None
        for directions in results.values():  # keyed by the worker's global rank
            for direction in directions or []:
                self._store(ctx, direction)
        ctx.advance(1)

    def _store(self, ctx: ProfileContext, d: dict) -> None:
        samples = [{"params": {"src_host": d["src_host"], "dst_host": d["dst_host"], "size_bytes": s},
                    "metrics": {"seconds": t}} for s, t in d["samples"]]
        top = max(s for s, _ in d["samples"])
        eff = statistics.median(s / t for s, t in d["samples"] if s == top)
        run_id = ctx.record("link.p2p", {"src_host": d["src_host"], "dst_host": d["dst_host"],
                                         "src_region": d["src_region"], "dst_region": d["dst_region"],
                                         "alpha_fit_s": d["alpha_fit"]}, samples,
                            f"{d['src_host']}→{d['dst_host']}: β {d['beta_Bps'] * 8 / 1e6:.1f} Mbit/s, "
                            f"α {d['alpha_s'] * 1e3:.2f} ms, resid {d['residual']:.3f} "
                            f"(largest msg {eff * 8 / 1e6:.1f} Mbit/s)", device_id=None)
        ctx.db.add_link(src_host=d["src_host"], dst_host=d["dst_host"], src_region=d["src_region"],
                        dst_region=d["dst_region"], alpha_s=d["alpha_s"], beta_Bps=d["beta_Bps"],
                        residual=d["residual"], run_id=run_id)
