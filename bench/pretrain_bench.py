"""hetprof's training cost model against published pre-training throughput (Megatron-Bridge).

The RL cases (published_bench.py) check whole RL steps; this checks the training pass alone, on
rows where the framework's own engineers tuned the layout: every row of a published pre-training
table hetprof can express (bench/pretraining/*.yaml: the citation, the systems, the rows), priced
at the row's layout with the same catalog and cost model as everything else. Per row: one
optimizer step of GBS sequences — each replica's forward and backward passes over its micro-batches
(pipeline bubble and tensor-, expert- and pipeline-parallel traffic included), its Adam step, and
the data-parallel gradient sync over the link the DP group crosses, the
expert all-to-alls over the link the EP group crosses — as tokens/s/GPU against the
published figure, then the median |ln(predicted/published)| of dense and MoE rows apart.

    .venv/bin/python bench/pretrain_bench.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from hetprof.costmodels import LinkSpec, Placement, Work, comm, get_cost_model
from hetprof.specs.catalog import builtin
from hetprof.specs.models import PRESETS

TABLES = Path(__file__).resolve().parent / "pretraining"
BAND = (0.80, 1.25)
FORCED_BALANCE = 1.0  # "we force-balance the token distribution among experts" (every table's note)
IB_ALPHA_S = 1e-5  # per message between hosts (the published clusters' 0.005 ms latency, both ways)
console = Console(width=150)  # the table's widest rows on one line in a log file


@dataclass(frozen=True)
class Row:
    model: str
    system: str
    gpus: int
    dtype: str
    gbs: int
    mbs: int
    seq: int
    fsdp: int
    tp: int
    pp: int
    vp: int  # Megatron's virtual pipeline stages (interleaved 1F1B)
    ep: int
    published: float  # tokens/s/GPU

    @property
    def moe(self) -> bool:
        return PRESETS[self.model].moe is not None


def load(path: Path) -> tuple[dict, dict, list[Row]]:
    data = yaml.safe_load(path.read_text())
    return data["source"], data["systems"], [Row(*r) for r in data["rows"]]


def network_link(system: dict) -> LinkSpec:
    """The hosts' network at the catalog's inter-host goodput."""
    nominal = system["host_Gbps"] * 1e9 / 8
    return LinkSpec(IB_ALPHA_S, nominal * builtin().inter_host(nominal))


def group_link(system: dict, gpus: int, device_link: LinkSpec) -> LinkSpec:
    """The link a data-parallel group of `gpus` GPUs crosses: NVLink while they fit in one NVLink
    domain, else the hosts' network."""
    return device_link if gpus <= system["nvlink_domain"] else network_link(system)


def expert_link(system: dict, gpus: int, device_link: LinkSpec) -> LinkSpec:
    """One GPU's goodput in an expert-parallel group of `gpus` GPUs: NVLink within one NVLink domain,
    else the other hosts' share over the network beside the rest over NVLink, as the planner prices
    it (comm.all_to_all_Bps)."""
    if gpus <= system["nvlink_domain"]:
        return device_link
    network = network_link(system)
    return LinkSpec(network.alpha_s, comm.all_to_all_Bps(device_link.beta_Bps, network.beta_Bps, gpus,
                                                         system["host_gpus"]))


def price(row: Row, system: dict, cm) -> dict:
    """One optimizer step of the row at its layout: seconds by part and tokens/s/GPU."""
    model = PRESETS[row.model]
    gpu = system["gpu"]
    dp = row.gpus // (row.tp * row.pp)
    batch = row.gbs // dp
    # Megatron's EP counts GPUs holding different experts; hetprof's ep counts replicas, and whole
    # experts fold the group over the TP ranks (expert_tensor_parallel_size 1: Megatron-Bridge's
    # recipes/qwen/{h100,gb200}/qwen3_moe.py at the tables' commit).
    ep = max(1, row.ep // row.tp)
    etp = 1 if model.moe is not None and row.tp > 1 else None
    # the tables' MoE benchmarks force the router to balance: no rank waits for a busier one
    work = Work("training", model, batch, 0, row.seq, dtype=row.dtype, token_budget=row.mbs * row.seq,
                expert_imbalance=FORCED_BALANCE)
    sharding = "fsdp" if row.fsdp else "zero1"
    device_link = cm.device_link(gpu)[0]
    place = Placement(gpu, row.tp, row.pp, microbatches=max(1, batch // row.mbs), dp=dp, sharding=sharding, ep=ep,
                      ep_link=expert_link(system, row.ep, device_link), virtual_stages=row.vp if row.pp > 1 else 1,
                      etp=etp)
    est = cm.task_time(work, place)
    parts = dict(est.breakdown)
    parts["adam"] = cm.optimizer_step_time(work, place)
    link = group_link(system, row.gpus, device_link)
    parts["dp_sync"] = cm.dp_grad_sync_time(work, place, dp, link, sharding, est.seconds) if dp > 1 else 0.0
    seconds = est.seconds + parts["adam"] + parts["dp_sync"]
    predicted = row.gbs * row.seq / (seconds * row.gpus)
    return {"model": row.model, "system": row.system, "gpus": row.gpus, "precision": row.dtype,
            "layout": f"TP{row.tp} PP{row.pp}" + (f" VP{row.vp}" if row.pp > 1 and row.vp > 1 else "") + f" EP{row.ep} DP{dp}" + (" FSDP" if row.fsdp else ""),
            "moe": row.moe, "seconds": seconds, "parts": parts, "predicted": predicted,
            "published": row.published, "ratio": predicted / row.published}


def _ratio_text(ratio: float) -> str:
    colour = "green" if BAND[0] <= ratio <= BAND[1] else "yellow" if 0.67 <= ratio <= 1.5 else "red"
    return f"[{colour}]{ratio:.2f}[/{colour}]"


def table(title: str, priced: list[dict]) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("model", "system", "precision", "layout", "pred tok/s/GPU", "pub tok/s/GPU", "pred/pub",
                "where the time goes"):
        t.add_column(col, justify="left" if col in ("model", "system", "layout", "where the time goes") else "right")
    for p in priced:
        share = sorted(p["parts"].items(), key=lambda kv: -kv[1])[:2]
        t.add_row(p["model"], p["system"], p["precision"], p["layout"], f"{p['predicted']:.0f}",
                  f"{p['published']:.0f}", _ratio_text(p["ratio"]),
                  ", ".join(f"{k} {v / p['seconds']:.0%}" for k, v in share))
    return t


def summary(priced: list[dict]) -> Table:
    t = Table(title="Summary: predicted / published tokens/s/GPU (> 1: hetprof prices the step too fast)",
              title_justify="left")
    for col in ("rows", "n", "within 0.80–1.25", "median ratio", "median |ln ratio|"):
        t.add_column(col, justify="left" if col == "rows" else "right")
    groups = {"all": priced, "dense": [p for p in priced if not p["moe"]], "MoE": [p for p in priced if p["moe"]]}
    for table_name in dict.fromkeys(p["table"] for p in priced):  # each release apart: software moves them
        for kind, moe in (("dense", False), ("MoE", True)):
            groups[f"{table_name} {kind}"] = [p for p in priced if p["table"] == table_name and p["moe"] == moe]
    for name, ps in groups.items():
        if not ps:
            continue
        inside = sum(BAND[0] <= p["ratio"] <= BAND[1] for p in ps)
        t.add_row(name, str(len(ps)), f"{inside}/{len(ps)}", f"{statistics.median(p['ratio'] for p in ps):.2f}",
                  f"{statistics.median(abs(math.log(p['ratio'])) for p in ps):.3f}")
    return t


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="also write the priced rows here")
    args = ap.parse_args(argv)
    cm = get_cost_model("analytical")
    out = []
    for path in sorted(TABLES.glob("*.yaml")):
        source, systems, rows = load(path)
        priced = [{**price(r, systems[r.system], cm), "table": path.stem} for r in rows]
        console.print(table(f"{path.stem}  [dim]({source['title']}, {source['date']})[/dim]", priced))
        out.extend(priced)
    console.print(summary(out))
    if args.json:
        args.json.write_text(json.dumps({"rows": out}, indent=1, default=float))


if __name__ == "__main__":
    main()
