"""The task shapes one RL workload will really run, added to the tasks suite's grid.

A fitted cost model is best between the points it was fitted on, and CPU (and small-GPU) kernel
times are not smooth in shape (a few tokens more can cost far more than the grid's neighbours
suggest; docs/DESIGN.md §10). A plan for a known job should be
predicted from rows at the job's own shapes, as the simulator asks for them: per-replica batches
for every data-parallel degree the cluster allows, the prompt block (mean and longest), the whole
sequence (prompt + response) that inference and training see, decode contexts across the response,
and training's mini-batch rows. A workload with `training.max_tokens_per_microbatch` runs packed
micro-batches, priced pack by pack at each pack's sequences and tokens (hetprof.runtime.tokenbudget.pack_groups)
and recorded by a run at its average pack (hetprof.runtime.tokenbudget.mean_pack): those rows are measured too. Each point is measured like any grid point, so the rows also serve
other workloads; `hetprof profile --workload W.yaml` is all a user has to add.
"""

from __future__ import annotations

import math

import numpy as np

from hetprof.runtime.tokenbudget import groups_shape, mean_pack, pack_groups, step_prompts
from hetprof.specs import WorkloadSpec
from hetprof.specs.models import ModelShape

# The planner's default seed for the step's sampled response lengths (planner/simulator.py).
LENGTH_SEED = 0

# A long-tailed batch packs into many pack sizes (23 for 1,024 lognormal responses in 32k-token
# packs): the grid measures the sizes that hold the most packs, and the fit prices the rest.
PACK_SHAPES_PER_BATCH = 3

# The keys of `workload_points` naming the prefill points a padded and a packed inference pass runs
# at, and the train points a packed training micro-batch runs at.
PADDED_PREFILL = "padded_prefill"
PACKED_PREFILL = "packed_prefill"
PACKED_TRAIN = "packed_train"

# Above this many devices, data-parallel degrees are sampled (powers of two and the total).
DENSE_DEGREES = 8


def dp_degrees(devices: int) -> list[int]:
    """Data-parallel degrees a plan may give a task on `devices` devices."""
    devices = max(1, int(devices))
    if devices <= DENSE_DEGREES:
        return list(range(1, devices + 1))
    out = {1 << k for k in range(int(math.log2(devices)) + 1)}
    out.add(devices)
    return sorted(out)


def workload_points(workload: WorkloadSpec, devices: int) -> dict[str, list[tuple[int, ...]]]:
    """(batch, length) points per task kernel (prefill, decode, train, generate) for `workload` on up to
    `devices` devices; lengths in tokens, as the executor pads them (a batch is as wide as its
    longest prompt plus its longest response). Under `PADDED_PREFILL`, (batch, length) of the padded
    inference passes among the prefill points; under `PACKED_PREFILL`, (batch, length, response)
    of the packed ones; under `PACKED_TRAIN`, those of the packed training micro-batches among the
    train points."""
    prompt_mean = max(1, round(workload.prompt_len.mean))
    prompt_max = max(prompt_mean, workload.prompt_len.cap)
    resp_mean = max(1, round(workload.response_len.mean))
    resp_max = max(resp_mean, workload.response_len.cap)
    # the widths `hetprof run` pads to, as the planner prices them (planner/taskcosts.py): a step's
    # inference and training batch is as wide as its longest prompt plus its longest response
    padded = max(1, round(workload.prompt_len.expected_longest(workload.prompts_per_step)
                          + workload.response_len.expected_longest(workload.sequences_per_step)))
    prompts = sorted({prompt_mean, prompt_max})
    sequences = sorted({prompt_mean + resp_mean, prompt_max + resp_max, padded})
    contexts = sorted({prompt_mean + 1, prompt_mean + max(1, resp_mean // 2), prompt_max + resp_max})
    batches = sorted({math.ceil(workload.sequences_per_step / d) for d in dp_degrees(devices)})
    train_batches = sorted({max(1, math.ceil(b / workload.mini_batches)) for b in batches})

    # a generator replica's prompts, unpadded and padded to its longest (of its distinct prompts)
    gen = {b: sorted({*prompts, max(1, round(workload.prompt_len.expected_longest(
        math.ceil(b / workload.responses_per_prompt))))}) for b in batches}
    packed_infer, packed_train = packed_points(workload, batches, train_batches)
    # a padded workload's reference and log-prob passes: each replica's rows at the step's padded width
    padded_infer = set() if workload.training.max_tokens_per_microbatch else {(b, padded) for b in batches}
    return {
        # generation's prefill over prompts, and the inference forward over whole sequences
        "prefill": sorted({(b, n) for b in batches for n in sorted({*gen[b], *sequences})} | packed_infer),
        # which of them a padded inference pass runs, and a packed one, with its response tokens
        # (the columns it scores)
        PADDED_PREFILL: sorted(padded_infer),
        PACKED_PREFILL: sorted((b, n, resp_mean) for b, n in packed_infer),
        "decode": [(b, n) for b in batches
                   for n in sorted({*contexts, *(p + 1 for p in gen[b]), *(p + max(1, resp_mean // 2) for p in gen[b])})],
        "train": sorted({(b, n) for b in train_batches for n in sequences} | packed_train),
        PACKED_TRAIN: sorted((b, n, resp_mean) for b, n in packed_train),
        # a whole generation call over the prompts (what it costs beyond its phases)
        "generate": [(b, n) for b in batches for n in gen[b]],
    }


def packed_points(workload: WorkloadSpec, batches: list[int],
                  train_batches: list[int]) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """(sequences per micro-batch, mean length) of the packed inference and training passes over
    each per-replica batch; none when the workload pads."""
    budget = workload.training.max_tokens_per_microbatch
    if budget is None:
        return set(), set()
    responses = np.sort(workload.response_len.sample(workload.sequences_per_step, np.random.default_rng(LENGTH_SEED)))
    prompt = float(workload.prompt_len.mean)
    prompts = step_prompts(workload.prompt_len, workload.prompts_per_step)  # as the planner packs them
    whole = max(1, round(prompt + workload.response_len.mean))

    def shapes(sizes: list[int]) -> set[tuple[int, int]]:
        """Each batch's most common packs as the planner prices them, its fullest pack at the mean
        length (the bench's drift probe), and the average pack a run records."""
        out: set[tuple[int, int]] = set()
        for b in sizes:
            groups = pack_groups(prompts, responses, b, budget)
            common = sorted(groups, key=lambda g: -g[2])[:PACK_SHAPES_PER_BATCH]
            out |= {(n, max(1, round(length))) for n, length, _ in common}
            packs, fullest = groups_shape(groups, b)
            out.add((fullest, whole))
            out.add(mean_pack(b, packs, prompt + workload.response_len.mean))
        return out

    return shapes(batches), shapes(train_batches)


def workload_models(workload: WorkloadSpec) -> list[ModelShape]:
    """The distinct model shapes of a workload's roles, in role order."""
    out: list[ModelShape] = []
    for shape in workload.roles().values():
        if shape not in out:
            out.append(shape)
    return out


def merge_points(grid: list[tuple[int, int]], extra: list[tuple[int, int]], max_position: int) -> list[tuple[int, int]]:
    """The grid plus the extra points that fit the model's positions, each once, grid first."""
    seen = set(grid)
    out = list(grid)
    for point in extra:
        if point not in seen and point[1] + 1 <= max_position:
            seen.add(point)
            out.append(point)
    return out
