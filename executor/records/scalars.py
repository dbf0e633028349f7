"""The scalars an iteration record is logged as (TensorBoard, Weights & Biases): hetprof's own
tags, and the same quantities again under verl's metric names, so a dashboard made for verl runs
reads a hetprof run.

hetprof's tags: reward/mean, reward/std, train/kl, train/entropy, train/clip_frac, train/grad_norm,
train/lr, train/policy_loss, critic/<stat>, batch/response_len, batch/prompt_len,
batch/staleness_max, throughput/tokens_per_s, time/iteration_s, time/predicted_iteration_s,
mfu/<training task> (records/mfu.py: only where the catalog has a peak), and per task and sync
edge seconds/<task>/measured beside seconds/<task>/predicted.

verl's names (verl/trainer/ppo/metric_utils.py and its actor and critic workers) are given only to
what means the same here: a quantity computed differently (verl's `actor/ppo_kl` is the mean
log-ratio, hetprof's approx_kl its half square) gets none. With the KL penalty in the reward (PPO),
hetprof's reward and its k3 KL are not verl's `critic/rewards/mean` and `actor/kl_loss`, so those two
are left out there.
"""

from __future__ import annotations

from typing import Any

SCALARS = {
    "reward/mean": "reward_mean", "reward/std": "reward_std", "train/kl": "kl", "train/entropy": "entropy",
    "train/clip_frac": "clip_frac", "train/grad_norm": "grad_norm", "train/lr": "lr",
    "train/policy_loss": "policy_loss", "batch/response_len": "response_tokens_mean",
    "batch/prompt_len": "prompt_tokens_mean", "batch/staleness_max": "staleness_max",
    "throughput/tokens_per_s": "tokens_per_s", "time/iteration_s": "iteration_s",
    "time/predicted_iteration_s": "predicted_iteration_s",
}

# verl's name -> the record field that means the same
VERL_FIELDS = {
    "actor/pg_loss": "policy_loss", "actor/entropy": "entropy", "actor/pg_clipfrac": "clip_frac",
    "actor/grad_norm": "grad_norm", "actor/lr": "lr", "critic/score/mean": "reward_mean",
    "response_length/mean": "response_tokens_mean", "prompt_length/mean": "prompt_tokens_mean",
    "timing_s/step": "iteration_s", "perf/time_per_step": "iteration_s",
    "critic/vf_loss": "critic_value_loss", "critic/vf_clipfrac": "critic_value_clip_frac",
    "critic/vpred_mean": "critic_value_mean", "critic/grad_norm": "critic_grad_norm", "critic/lr": "critic_lr",
}
# the same, only while the KL to the reference is in the loss rather than the reward
VERL_KL_IN_LOSS = {"critic/rewards/mean": "reward_mean", "actor/kl_loss": "kl"}
# verl's timing_s/<name> for each measured task or step of the iteration
VERL_TIMING = {"actor_gen": "gen", "actor_logprob": "old_log_prob", "ref_infer": "ref", "critic_infer": "values",
               "reward": "reward", "advantage": "adv", "actor_train": "update_actor",
               "critic_train": "update_critic", "weight_sync": "update_weights"}
VERL_MFU = {"actor_train": "perf/mfu/actor", "critic_train": "perf/mfu/critic"}


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """Tag -> value of one iteration record (fields that are absent or not numbers are left out)."""
    out = {tag: float(record[key]) for tag, key in SCALARS.items() if _number(record.get(key))}
    out.update({f"critic/{k.removeprefix('critic_')}": float(v) for k, v in record.items()
                if k.startswith("critic_") and _number(v)})
    predicted = record.get("predicted", {})
    for task, seconds in record.get("stages", {}).items():
        out[f"seconds/{task}/measured"] = float(seconds)
        if _number(predicted.get(task)):
            out[f"seconds/{task}/predicted"] = float(predicted[task])
    out.update({f"mfu/{task}": float(v) for task, v in record.get("mfu", {}).items() if _number(v)})
    out.update(verl_scalars(record))
    return out


def verl_scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's quantities that verl logs too, under verl's names."""
    fields = dict(VERL_FIELDS) if record.get("kl_in_reward") else {**VERL_FIELDS, **VERL_KL_IN_LOSS}
    out = {name: float(record[key]) for name, key in fields.items() if _number(record.get(key))}
    out.update({f"timing_s/{VERL_TIMING[task]}": float(s) for task, s in record.get("stages", {}).items()
                if task in VERL_TIMING and _number(s)})
    out.update({VERL_MFU[task]: float(v) for task, v in record.get("mfu", {}).items() if task in VERL_MFU and _number(v)})
    # verl's throughput: prompt and response tokens of the batch per second per device
    sequences, seconds, devices = record.get("sequences"), record.get("iteration_s"), record.get("device_count")
    lengths = [record.get("prompt_tokens_mean"), record.get("response_tokens_mean")]
    if all(_number(v) for v in (sequences, seconds, devices, *lengths)) and sequences and seconds and devices:
        total = sequences * (lengths[0] + lengths[1])
        out["perf/total_num_tokens"] = float(round(total))
        out["perf/throughput"] = total / (seconds * devices)
    return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
