"""Task rows: the contract's keys, measured on the same HF model code the executor runs."""

from __future__ import annotations

import pytest
import torch

from hetprof.profiler import taskmodels
from hetprof.profiler.context import ProfileContext
from hetprof.profiler.suites.tasks import TasksSuite
from hetprof.profiles import ProfileDB
from hetprof.specs.models import PRESETS

SHAPE_KEYS = {"model", "layers_run", "hidden", "ffn", "heads", "kv_heads", "head_dim", "vocab", "dtype"}


@pytest.fixture(scope="module")
def task_rows(tmp_path_factory):
    """The suite's rows, its step counts, and the (batch, tokens) of every forward the model ran."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    forwards: list[tuple[int, int, bool]] = []  # batch, tokens fed, with a KV cache

    def watched(tm, device):
        model = build(tm, device)

        def seen(_module, args, kwargs):
            x = kwargs.get("input_ids", kwargs.get("inputs_embeds"))
            forwards.append((int(x.shape[0]), int(x.shape[1]), kwargs.get("past_key_values") is not None))
        model.register_forward_pre_hook(seen, with_kwargs=True)
        return model

    build = taskmodels.build
    try:
        with ProfileDB(tmp_path_factory.mktemp("tasks") / "p.db") as db, pytest.MonkeyPatch.context() as mp:
            mp.setattr(taskmodels, "build", watched)
            ctx = ProfileContext(db=db, host="t", device="cpu", device_id=None, quick=True, threads=1,
                                 models=[PRESETS["tiny"]], devices=["cpu"])
            steps = TasksSuite().steps(ctx)
            done = []
            ctx.advance = done.append
            TasksSuite().run(ctx)
            return db.samples("task."), steps, sum(done), forwards
    finally:
        torch.set_num_threads(before)


def test_rows_carry_the_contract_keys(task_rows):
    df, _, _, _ = task_rows
    for bench, length_key in (("task.prefill", "seq_len"), ("task.decode", "context_len"),
                              ("task.train", "seq_len")):
        rows = df[df.benchmark == bench]
        assert len(rows) > 0, bench
        assert rows[[*SHAPE_KEYS, "batch", length_key, "seconds", "threads"]].notna().all().all(), bench
        assert (rows["model"] == "tiny").all() and (rows["threads"] == 1).all()
        assert (rows["layers_run"] == PRESETS["tiny"].layers).all() and rows["with_head"].all()
        assert (rows["seconds"] > 0).all()
        assert rows["batch"].nunique() >= 3 and rows[length_key].nunique() >= 3  # range for a regression
    assert (df[df.benchmark == "task.train"]["recompute"] == False).all()  # noqa: E712


def test_progress_steps_match_the_sweep(task_rows):
    _, steps, done, _ = task_rows
    assert steps == done > 0


def test_each_row_times_the_model_at_its_own_shape(task_rows):
    """Every row's shape is one the model really ran: prefill and training over batch × seq_len, a
    decode step one new token per sequence on top of a cache (not timings compared: this machine is
    shared, and which of two small shapes is faster is its noise)."""
    df, _, _, forwards = task_rows
    ran = set(forwards)
    for bench, length_key, cached in (("task.prefill", "seq_len", False), ("task.train", "seq_len", False)):
        for batch, length in df[df.benchmark == bench][["batch", length_key]].drop_duplicates().itertuples(index=False):
            assert (int(batch), int(length), cached) in ran, (bench, batch, length)
    for batch in df[df.benchmark == "task.decode"]["batch"].unique():
        assert (int(batch), 1, True) in ran, ("task.decode", batch)


def test_big_presets_run_a_few_blocks_without_the_head():
    tm = taskmodels.plan_model(PRESETS["qwen3-8b"], "bf16", None)
    assert tm.layers_run == 2 and not tm.with_head
    assert taskmodels.plan_model(PRESETS["tiny-2x"], "fp32", None).with_head
    assert taskmodels.plan_model(PRESETS["qwen3-8b"], "bf16", 3).layers_run == 3


def test_block_model_matches_the_preset_shapes():
    shape = PRESETS["tiny-2x"]
    tm = taskmodels.plan_model(shape, "fp32", 1)
    model = taskmodels.build(tm, "cpu")
    cfg = model.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.num_hidden_layers) == (shape.hidden, shape.ffn, shape.heads, shape.kv_heads, 1)
    assert sum(p.numel() for p in model.layers[0].parameters()) == shape.params_per_layer
    x = taskmodels.inputs(tm, 2, 8, "cpu")  # a block without its head is fed embeddings, never zeros
    assert x["inputs_embeds"].shape == (2, 8, shape.hidden) and bool((x["inputs_embeds"] != 0).all())
    whole = taskmodels.plan_model(shape, "fp32", None)
    ids = taskmodels.inputs(whole, 2, 8, "cpu")["input_ids"]
    assert int(ids.max()) < shape.vocab
    assert taskmodels.build(whole, "cpu")(input_ids=ids).logits.shape == (2, 8, shape.vocab)


def test_generate_rows_time_whole_calls(task_rows):
    from hetprof.profiler.suites.tasks import GENERATE_NEW_TOKENS, TIMERS

    df, _, _, _ = task_rows
    calls = df[df.benchmark == "task.generate"]
    assert len(calls) > 0 and (calls["new_tokens"] == GENERATE_NEW_TOKENS).all()
    assert calls[[*SHAPE_KEYS, "batch", "seq_len", "seconds"]].notna().all().all()
    # the grid's call shapes are timed (how a call's time compares with its prefill and steps is a
    # timing, which the cost-model bench reports)
    assert {(32, 128), (1, 16)} <= set(calls.groupby(["batch", "seq_len"]).size().index)
    assert (calls["seconds"] > 0).all()
    # blocks profiled without the LM head have no logits to sample from: no calls timed
    assert not TIMERS["generate"].applies(taskmodels.plan_model(PRESETS["qwen3-8b"], "bf16", None))


def _cache(root, name: str, size: str, shared: str) -> None:
    index = root / name
    index.mkdir()
    (index / "size").write_text(size + "\n")
    (index / "shared_cpu_list").write_text(shared + "\n")


def test_core_cache_is_the_largest_cache_one_core_has_alone(tmp_path):
    from hetprof.profiler.hostinfo import core_cache_bytes

    _cache(tmp_path, "index0", "48K", "0")
    _cache(tmp_path, "index2", "2048K", "0")
    _cache(tmp_path, "index3", "491520K", "0-1")  # the shared L3 is not the core's own
    assert core_cache_bytes(str(tmp_path)) == 2048 * 1024
    assert core_cache_bytes(str(tmp_path / "absent")) == 2 * 1024 * 1024  # no sysfs: a server core's L2


def test_cpu_flusher_evicts_only_when_asked():
    from hetprof.profiler.hostinfo import core_cache_bytes
    from hetprof.profiler.timing import Flusher

    assert Flusher(torch.device("cpu")).buffer is None  # the other suites' operands outsize the caches
    flush = Flusher(torch.device("cpu"), cpu_caches=True)
    assert flush.buffer.numel() * 4 == 2 * core_cache_bytes()
    flush()
    assert float(flush.buffer[-1]) == 1.0


def test_response_columns_score_the_last_response_tokens():
    from hetprof.profiler.suites.tasks import response_columns

    # length 6, response 2: tokens 4 and 5 are scored by shifted columns 3 and 4
    assert response_columns(2, 6, 2).tolist() == [[0, 0, 0, 1, 1]] * 2
    assert response_columns(1, 3, 9).tolist() == [[1, 1]]  # a response longer than the row: every column


def _tiny_sweep(points: dict) -> tuple:
    """(planned model, model, profiling context) of the tiny preset on CPU with `points` as the
    `--workload` grid."""
    tm = taskmodels.plan_model(PRESETS["tiny"], "fp32", None)
    ctx = ProfileContext(db=None, host="t", device="cpu", device_id=None, quick=True, threads=1,
                         options={"workload_points": points})
    return tm, taskmodels.build(tm, "cpu"), ctx


def test_packed_inference_points_time_the_runs_packed_pass(monkeypatch):
    """At a `--workload` packed inference point the prefill row times `packed_token_logprobs` (the
    function a run's reference and log-prob passes call) on one pack, scoring the response columns."""
    import hetprof.profiler.suites.tasks as tasks
    from hetprof.profiler.timing import Flusher

    calls = []

    def spy(model, ids, mask, temperature=1.0, **kw):
        calls.append((tuple(ids.shape), int(mask.sum()), int(kw["needed"].sum())))

    monkeypatch.setattr(tasks, "packed_token_logprobs", spy)
    tm, model, ctx = _tiny_sweep({"prefill": [(3, 10)], "packed_prefill": [(3, 10, 4)]})
    cpu = torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    times = tasks.TIMERS["prefill"].time_point(ctx, model, tm, 3, 10, {}, cpu, Flusher(cpu), gen)
    runs = ctx.policy.warmup + len(times)
    assert calls == [((3, 10), 30, 12)] * runs  # one pack of 3 × 10 tokens, 3 × 4 response columns
    tasks.TIMERS["prefill"].time_point(ctx, model, tm, 4, 10, {}, cpu, Flusher(cpu), gen)  # not packed
    assert len(calls) == runs


def test_padded_inference_points_time_the_runs_padded_pass(monkeypatch):
    """At a `--workload` padded inference point the prefill row times `token_logprobs` (the function a
    run's padded reference and log-prob passes call: no KV cache, fp32 log-probs over the vocabulary)
    on the padded batch; at any other point, and for a model profiled without its head, the forward."""
    import hetprof.profiler.suites.tasks as tasks
    from hetprof.profiler.timing import Flusher

    calls = []
    monkeypatch.setattr(tasks, "token_logprobs", lambda model, ids, mask: calls.append((tuple(ids.shape),
                                                                                         int(mask.sum()))))
    tm, model, ctx = _tiny_sweep({"prefill": [(3, 16), (4, 16)], "padded_prefill": [(3, 16)]})
    cpu = torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    times = tasks.TIMERS["prefill"].time_point(ctx, model, tm, 3, 16, {}, cpu, Flusher(cpu), gen)
    runs = ctx.policy.warmup + len(times)
    assert calls == [((3, 16), 3 * 16 - 2 * 2)] * runs  # the padded mask: rows 0 and 2 start with 16 // 8 pads
    tasks.TIMERS["prefill"].time_point(ctx, model, tm, 4, 16, {}, cpu, Flusher(cpu), gen)  # generation's prefill
    headless = taskmodels.plan_model(PRESETS["tiny"], "fp32", 1)
    tasks.TIMERS["prefill"].time_point(ctx, taskmodels.build(headless, "cpu"), headless, 3, 16, {}, cpu,
                                       Flusher(cpu), gen)
    assert len(calls) == runs


def test_measure_round_robin_takes_turns_and_stops_each_call_on_its_own():
    from hetprof.profiler.timing import Timed, TimingPolicy, measure_round_robin

    order: list[str] = []
    policy = TimingPolicy(warmup=1, repeats=3, min_repeats=2, max_seconds=1e9)
    calls = [Timed(lambda: order.append("a"), setup=lambda: order.append("a-setup")),
             Timed(lambda: order.append("b"))]
    samples = measure_round_robin(calls, "cpu", policy)
    assert [len(s) for s in samples] == [3, 3]
    # one warm-up each, then every timed repeat of a call follows one of the other's
    assert order == ["a-setup", "a", "b"] + ["a-setup", "a", "b"] * 3


def test_measure_round_robin_time_budget_ends_a_slow_call_first():
    import time

    from hetprof.profiler.timing import Timed, TimingPolicy, measure_round_robin

    counts = {"slow": 0, "fast": 0}

    def slow() -> None:
        counts["slow"] += 1
        time.sleep(0.2)

    policy = TimingPolicy(warmup=0, repeats=5, min_repeats=2, max_seconds=0.15)
    samples = measure_round_robin([Timed(slow), Timed(lambda: counts.__setitem__("fast", counts["fast"] + 1))],
                                  "cpu", policy)
    assert len(samples[0]) == 2  # over budget after its first repeat: stops at min_repeats
    assert len(samples[1]) == 5 and counts == {"slow": 2, "fast": 5}


def test_packed_train_points_time_the_learners_packed_pass(monkeypatch):
    """At a `--workload` packed training point the train row runs the learner's packed pass (with
    entropy, on the response columns); at any other point the padded step."""
    import hetprof.profiler.suites.tasks as tasks
    from hetprof.profiler.timing import Flusher

    real, calls = tasks.packed_token_logprobs, []

    def spy(model, ids, mask, temperature=1.0, **kw):
        calls.append((tuple(ids.shape), kw["with_entropy"], int(kw["needed"].sum())))
        return real(model, ids, mask, temperature, **kw)

    monkeypatch.setattr(tasks, "packed_token_logprobs", spy)
    tm, model, ctx = _tiny_sweep({"train": [(2, 8)], "packed_train": [(2, 8, 3)]})
    cpu = torch.device("cpu")
    times = tasks.TIMERS["train"].time_point(ctx, model, tm, 2, 8, {}, cpu, Flusher(cpu), torch.Generator())
    assert calls == [((2, 8), True, 6)] * (ctx.policy.warmup + len(times))
    tasks.TIMERS["train"].time_point(ctx, model, tm, 3, 8, {}, cpu, Flusher(cpu), torch.Generator())  # padded
    assert len(calls) == ctx.policy.warmup + len(times)
    assert model.training is False  # the sweep hands the model back in eval mode


def test_a_sweep_takes_turns_only_among_calls_a_run_makes_once(monkeypatch):
    """Padded prefill points (generation's prefill, a padded pass) are timed in turns together; a
    packed pass's point, whose packs a run makes back to back, alone; training points alone."""
    import hetprof.profiler.suites.tasks as tasks
    from hetprof.profiler.timing import Flusher

    real, groups = tasks.measure_round_robin, []

    def spy(calls, device, policy):
        groups.append(len(calls))
        return real(calls, device, policy)

    monkeypatch.setattr(tasks, "measure_round_robin", spy)
    tm, model, ctx = _tiny_sweep({"packed_prefill": [(3, 8, 2)]})
    cpu, gen = torch.device("cpu"), torch.Generator()
    out = tasks.time_sweep(ctx, tasks.TIMERS["prefill"], model, tm, {}, [(2, 8), (3, 8), (4, 8)], cpu, Flusher(cpu), gen)
    assert groups == [2, 1] and all(len(t) >= ctx.policy.min_repeats for t in out)
    groups.clear()
    tasks.time_sweep(ctx, tasks.TIMERS["train"], model, tm, {}, [(1, 8), (2, 8)], cpu, Flusher(cpu), gen)
    assert groups == [1, 1]
