"""Realistic synthetic task rows for the cost-model tests: a simulated CPU with one-sided noise.

The simulated device is deliberately *not* a combination of the fitted model's features: a fixed
per-call cost, a per-layer dispatch cost, and matmuls whose efficiency rises with the tokens in
flight (small GEMMs run far below peak), plus attention and memory traffic — and its repeats suffer
the kind of interference a shared host adds (occasional +4 ms time slices).
"""

from __future__ import annotations

import numpy as np

from hetprof.costmodels import phases
from hetprof.costmodels.data import Phase
from hetprof.costmodels.features import PHASE_TASK
from hetprof.profiles import DeviceInfo, ProfileDB
from hetprof.specs.models import PRESETS, ModelShape

# A third small shape so that leaving one model out still trains on two models of different depth.
TINY_3L = ModelShape("tiny-3l", "qwen3", 3, 96, 288, 4, 2, 24, 64, True, 512, qk_norm=True)
MODELS = {"tiny": PRESETS["tiny"], "tiny-2x": PRESETS["tiny-2x"], "tiny-3l": TINY_3L}


def true_seconds(p: Phase) -> float:
    tokens = phases.tokens(p)
    eff = tokens / (tokens + 48.0)
    passes = 3.0 if p.kind == "train" else 1.0
    compute = phases.flops(p) / (4e10 * eff)
    memory = phases.memory_bytes(p) / 8e9
    return 3e-4 + p.layers * passes * 6e-5 + compute + memory


def add_rows(db: ProfileDB, models=("tiny", "tiny-2x", "tiny-3l"), batches=(1, 2, 4), lengths=(16, 48, 128),
             tasks=("prefill", "decode", "train"), repeats=5, seed=0, catalog_type="cpu") -> None:
    rng = np.random.default_rng(seed)
    dev = db.add_device(DeviceInfo(name=f"synthetic {catalog_type}", kind="cpu", catalog_type=catalog_type,
                                   host="synth"))
    for name in models:
        m = MODELS[name]
        for task in tasks:
            samples = []
            for b in batches:
                for s in lengths:
                    ph = Phase(task, m, m.layers, b, s, with_head=True, dtype="fp32")
                    t = true_seconds(ph)
                    length_key = "context_len" if task == "decode" else "seq_len"
                    for _ in range(repeats):
                        noise = t * rng.lognormal(0, 0.02) + (4e-3 if rng.random() < 0.3 else 0.0)
                        samples.append({"params": {
                            "model": name, "layers_run": m.layers, "hidden": m.hidden, "ffn": m.ffn,
                            "heads": m.heads, "kv_heads": m.kv_heads, "head_dim": m.head_dim, "vocab": m.vocab,
                            "batch": b, length_key: s, "dtype": "fp32", "with_head": True, "threads": 1,
                            **({"recompute": False} if task == "train" else {})},
                            "metrics": {"seconds": float(noise)}})
            db.add_benchmark(PHASE_TASK[task], dev, "synth", {"model": name}, samples)
