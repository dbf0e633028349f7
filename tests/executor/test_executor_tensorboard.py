"""TensorBoard scalars and text from iteration records, read back as TensorBoard reads them."""

from __future__ import annotations

import pytest
from test_executor_run_record import context, reports

from hetprof.executor.records.run_record import build_record
from hetprof.executor.records.tensorboard_log import TensorBoardLog, samples_markdown, scalars


def event_scalars(folder) -> tuple[dict[str, list[tuple[int, float]]], list[str], list[str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    values = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    texts = [t.tensor_proto.string_val[0].decode() for tag in acc.Tags()["tensors"] if tag.startswith("samples")
             for t in acc.Tensors(tag)]
    return values, texts, acc.Tags()["tensors"]


def records(n: int = 3) -> list[dict]:
    out = []
    for i in range(n):
        sent = reports()
        leader = sent[1]
        leader.batch.reward_mean, leader.batch.reward_std = 0.1 * i, 0.5
        leader.batch.samples = [{"prompt": "1+1=?", "answer": "2", "response": f"2|{i}\nok", "reward": 1.0}]
        leader.train_stats["actor_train"].update(grad_norm=2.0 + i, lr=1e-5)
        out.append(build_record(context(), i, 2.0, sent, 1, 100.0 + i))
    return out


def test_every_promised_scalar_and_the_samples_are_in_the_event_file(tmp_path):
    log = TensorBoardLog(tmp_path, "run-x")
    for rec in records():
        log.write(rec)
    log.close()
    values, texts, tags = event_scalars(tmp_path / "run-x")
    for tag in ("reward/mean", "reward/std", "train/kl", "train/entropy", "train/clip_frac", "train/grad_norm",
                "train/lr", "batch/response_len", "throughput/tokens_per_s", "seconds/actor_gen/measured",
                "seconds/actor_gen/predicted", "seconds/actor_train/measured", "seconds/actor_train/predicted",
                "time/iteration_s", "time/predicted_iteration_s"):
        assert [step for step, _ in values[tag]] == [0, 1, 2], tag
    assert [v for _, v in values["reward/mean"]] == pytest.approx([0.0, 0.1, 0.2])
    assert [v for _, v in values["train/grad_norm"]] == pytest.approx([2.0, 3.0, 4.0])
    assert values["seconds/actor_gen/predicted"][0][1] == pytest.approx(1.0)
    assert values["seconds/actor_gen/measured"][0][1] == pytest.approx(1.2)
    assert len(texts) == 3 and "1+1=?" in texts[0] and "2\\|0 ⏎ ok" in texts[0]
    assert "custom_scalars__config__" in tags  # the measured-vs-predicted chart per task


def test_scalars_leave_out_what_a_record_lacks_and_add_critic_statistics():
    rec = {"iteration": 0, "reward_mean": 1.0, "kl": None, "predicted_iteration_s": float("nan"),
           "critic_value_loss": 0.3, "stages": {"reward": 0.01}, "predicted": {}, "kl_in_reward": True}
    assert scalars(rec) == {"reward/mean": 1.0, "critic/value_loss": 0.3, "seconds/reward/measured": 0.01,
                            "critic/score/mean": 1.0, "critic/vf_loss": 0.3, "timing_s/reward": 0.01}


def test_verl_names_for_what_means_the_same():
    """A record's quantities that verl logs too appear again under verl's names; MFU only where the record
    has it; the reward and KL keep verl's names only while the KL is in the loss (not PPO's reward)."""
    rec = records(1)[0]
    rec["mfu"] = {"actor_train": 0.4}
    got = scalars(rec)
    assert {k: got[k] for k in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/lr", "actor/pg_clipfrac",
                                "actor/kl_loss", "critic/rewards/mean", "critic/score/mean", "response_length/mean",
                                "prompt_length/mean", "timing_s/gen", "timing_s/update_actor", "timing_s/ref",
                                "timing_s/adv", "timing_s/step", "perf/mfu/actor", "mfu/actor_train")} == {
        "actor/pg_loss": pytest.approx(rec["policy_loss"]), "actor/entropy": pytest.approx(rec["entropy"]),
        "actor/grad_norm": 2.0, "actor/lr": 1e-5, "actor/pg_clipfrac": pytest.approx(rec["clip_frac"]),
        "actor/kl_loss": pytest.approx(rec["kl"]), "critic/rewards/mean": 0.0, "critic/score/mean": 0.0,
        "response_length/mean": 6.0, "prompt_length/mean": 67.0, "timing_s/gen": 1.2, "timing_s/update_actor": 0.9,
        "timing_s/ref": 0.2, "timing_s/adv": 0.002, "timing_s/step": 2.0, "perf/mfu/actor": 0.4,
        "mfu/actor_train": 0.4}
    # verl's throughput: the batch's prompt and response tokens per second per device (16 × 73 over 2 s, 3 devices)
    assert got["perf/total_num_tokens"] == 16 * 73 and got["perf/throughput"] == pytest.approx(16 * 73 / (2.0 * 3))
    assert "perf/mfu/critic" not in got and "actor/ppo_kl" not in got
    ppo = scalars({**rec, "kl_in_reward": True})
    assert "critic/rewards/mean" not in ppo and "actor/kl_loss" not in ppo and ppo["critic/score/mean"] == 0.0


def test_samples_table_has_a_row_per_sample():
    table = samples_markdown([{"prompt": "a", "response": "b", "answer": None, "reward": 0.5}] * 2)
    assert table.splitlines()[2:] == ["| a | b |  | 0.500 |"] * 2


def test_a_resumed_run_replaces_the_iterations_it_runs_again(tmp_path):
    first, second = records(3), records(3)
    for rec in second:
        rec["reward_mean"] += 1.0
    log = TensorBoardLog(tmp_path, "run-x")
    for rec in first:
        log.write(rec)
    log.close()
    resumed = TensorBoardLog(tmp_path, "run-x", first=1)  # the checkpoint was after iteration 0
    for rec in second[1:]:
        resumed.write(rec)
    resumed.close()
    values, _, _ = event_scalars(tmp_path / "run-x")
    assert values["reward/mean"] == [(0, pytest.approx(0.0)), (1, pytest.approx(1.1)), (2, pytest.approx(1.2))]
