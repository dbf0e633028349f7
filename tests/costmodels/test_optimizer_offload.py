"""The optimizer held and stepped on the host (Megatron's optimizer_cpu_offload, DeepSpeed's
ZeRO-Offload), by hand: the device keeps the rest of the optimizer state, and an update pays the
host's Adam sweep or the copies down and up, whichever is slower."""

from __future__ import annotations

import pytest

from hetprof.costmodels import comm, get_cost_model, phases
from hetprof.costmodels.analytical import HOST_ADAM_BPS_PER_GPU, host_adam_seconds
from hetprof.costmodels.data import Placement, Work
from hetprof.costmodels.memory import params_on_device, task_memory
from hetprof.errors import SpecError
from hetprof.specs import WorkloadSpec
from hetprof.specs.executable import workload_problems
from hetprof.specs.models import ModelShape

# 4 layers, hidden 64, ffn 128, 4 heads and 2 KV heads of 16, vocab 100
M = ModelShape("toy", "llama", 4, 64, 128, 4, 2, 16, 100, False)


def _optimizer_bytes(share: float, tp: int = 1) -> float:
    return task_memory("training", M, 4, tp, 2, 100, "bf16", "none", 0, optimizer_offload=share).optimizer


@pytest.mark.parametrize("tp", [1, 2])
def test_the_device_keeps_the_share_of_the_optimizer_state_not_on_the_host(tp):
    whole = 12 * params_on_device(M, 4, tp)  # fp32 master, m and v per parameter
    assert _optimizer_bytes(0.0, tp) == pytest.approx(whole)
    assert _optimizer_bytes(0.25, tp) == pytest.approx(0.75 * whole)
    assert _optimizer_bytes(1.0, tp) == 0.0
    held = task_memory("training", M, 4, tp, 2, 100, "bf16", "none", 0, optimizer_offload=1.0)
    kept = task_memory("training", M, 4, tp, 2, 100, "bf16", "none", 0)
    assert (held.weights, held.grads, held.activations) == (kept.weights, kept.grads, kept.activations)


def test_host_adam_is_the_slower_of_its_copies_and_its_sweep_in_host_memory():
    params, link = 1e9, 25e9
    copies = params * (4 + 2) / link  # fp32 gradient down, bf16 weight up
    sweep = params * phases.ADAM_BYTES_PER_PARAM / HOST_ADAM_BPS_PER_GPU
    assert host_adam_seconds(params, "bf16", link) == pytest.approx(max(copies, sweep))
    assert host_adam_seconds(params, "bf16", 1e9) == pytest.approx(params * 6 / 1e9)  # a slow bus dominates
    assert host_adam_seconds(0, "bf16", link) == 0.0


def test_an_update_steps_the_device_share_in_hbm_and_the_host_share_on_the_host():
    cm = get_cost_model("analytical")
    place = Placement("H100-SXM")
    params = params_on_device(M, 4, 1)
    device_only = cm.optimizer_step_time(Work("training", M, 4, 20, 80), place)
    host_only = cm.optimizer_step_time(Work("training", M, 4, 20, 80, optimizer_offload=1.0), place)
    link = comm.host_link_Bps(cm.catalog.lookup("H100-SXM"), params * 6)
    assert host_only == pytest.approx(host_adam_seconds(params, "bf16", link))
    half = cm.optimizer_step_time(Work("training", M, 4, 20, 80, optimizer_offload=0.5), place)
    device_half = phases.adam_step_bytes(params / 2, "bf16")
    rate = cm.calibration.memory_rate("H100-SXM", None, device_half).value
    assert half == pytest.approx(device_half / rate + host_adam_seconds(params / 2, "bf16", link))
    assert device_only < half < host_only  # the host's memory is slower than HBM
    assert cm.optimizer_step_time(Work("inference", M, 4, 20, 80, optimizer_offload=1.0), place) == 0.0


def _workload(tmp_path, share) -> WorkloadSpec:
    path = tmp_path / "workload.yaml"
    path.write_text("models: {actor: qwen3-0.6b}\nprompt_len: {mean: 64}\nresponse_len: {mean: 64}\n"
                    f"training: {{optimizer_offload: {share}}}\n")
    return WorkloadSpec.load(path)


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_a_share_outside_zero_to_one_is_refused_naming_the_field_and_file(tmp_path, share):
    with pytest.raises(SpecError) as err:
        _workload(tmp_path, share)
    assert "training.optimizer_offload" in str(err.value) and "workload.yaml" in str(err.value)


def test_hetprof_run_says_it_does_not_step_the_optimizer_on_the_host(tmp_path):
    assert not any("optimizer_offload" in p for p in workload_problems(_workload(tmp_path, 0)))
    problems = workload_problems(_workload(tmp_path, 1.0))
    assert any(p.startswith("training.optimizer_offload 1:") for p in problems)


def test_a_fitted_training_phase_adds_only_what_the_host_share_changes(monkeypatch):
    from hetprof.costmodels.fitted import FittedCostModel

    cm = FittedCostModel(models=[])
    place = Placement("H100-SXM")
    on_device, held = Work("training", M, 4, 20, 80), Work("training", M, 4, 20, 80, optimizer_offload=1.0)
    # no fitted training model: the analytical step, as run
    assert cm.optimizer_step_time(held, place) == cm.analytical.optimizer_step_time(held, place)
    assert cm.optimizer_step_in_phase_time(held, place) == 0.0
    # a fitted training model: its profiled steps hold an on-device Adam step
    monkeypatch.setattr(cm, "lookup", lambda kind, device, dtype: object() if kind == "train" else None)
    device_step = cm.analytical.optimizer_step_time(on_device, place)
    assert cm.optimizer_step_time(on_device, place) == 0.0
    assert cm.optimizer_step_in_phase_time(held, place) == pytest.approx(device_step)
    assert cm.optimizer_step_time(held, place) == pytest.approx(
        cm.analytical.optimizer_step_time(held, place) - device_step)
