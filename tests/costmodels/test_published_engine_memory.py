"""vLLM's gpu_memory_utilization per workload: the share of a generator GPU its KV cache may fill, by hand."""

from __future__ import annotations

import pytest

from hetprof.costmodels import get_cost_model, memory
from hetprof.costmodels.data import Placement, Work
from hetprof.errors import SpecError
from hetprof.specs import WorkloadSpec
from hetprof.specs.models import ModelShape

M = ModelShape("toy", "llama", 4, 64, 128, 4, 2, 16, 100, False)
GPU = 1e8  # a 100 MB device: room for about a thousand of the toy's sequences


def test_kv_room_is_what_the_utilization_share_leaves_after_weights_and_workspace():
    weights = memory.params_on_device(M, 4, 1) * 2  # bf16
    workspace = memory.generation_workspace(M, 1)
    per_seq = 100 * memory.kv_bytes_per_token(M, 4, 1)  # 100-token sequences
    for share in (0.9, 0.8, 0.5):
        by_hand = int((share * GPU - weights - workspace) // per_seq)
        assert memory.max_concurrent_sequences(M, 4, 1, 100, "bf16", GPU, share) == by_hand
    assert memory.max_concurrent_sequences(M, 4, 1, 100, "bf16", GPU) == int((0.9 * GPU - weights - workspace)
                                                                             // per_seq)


def test_the_cost_model_reads_the_share_from_the_work():
    cm = get_cost_model("analytical")
    place = Placement("H100-SXM", 1)
    full = Work("generation", M, 1, 10, 90)
    less = Work("generation", M, 1, 10, 90, memory_utilization=0.5)
    gpu = cm.catalog.lookup("H100-SXM").memory_bytes
    assert cm.max_concurrent_sequences(less, place) == memory.max_concurrent_sequences(M, 4, 1, 100, "bf16", gpu, 0.5)
    assert cm.max_concurrent_sequences(less, place) < cm.max_concurrent_sequences(full, place)


def test_a_share_outside_0_1_is_refused_naming_the_field():
    data = {"name": "w", "models": {"actor": "qwen3-0.6b"}, "prompts_per_step": 4, "responses_per_prompt": 2,
            "prompt_len": {"mean": 8, "max": 8}, "response_len": {"mean": 8, "max": 8},
            "generation": {"gpu_memory_utilization": 1.5}}
    with pytest.raises(SpecError, match="gpu_memory_utilization"):
        WorkloadSpec.from_dict(data)
    data["generation"] = {"gpu_memory_utilization": 0.8}
    assert WorkloadSpec.from_dict(data).generation.gpu_memory_utilization == 0.8
