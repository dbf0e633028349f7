"""Properties of the plan simulator: the single source of truth every search is scored by."""

from __future__ import annotations

import math

import pytest

from hetprof.costmodels import get_cost_model
from hetprof.errors import InfeasibleError
from hetprof.planner.candidate import Candidate, even_layout
from hetprof.planner.graph import build_graph
from hetprof.planner.simulator import Simulator
from hetprof.specs import ClusterSpec, TaskLayout, WorkloadSpec

MODEL = "qwen3-0.6b"
LAYERS = 28


def cluster(inter: str | None = "10ms 5Gbps", a_type: str = "A100-40GB", b_type: str = "L4") -> ClusterSpec:
    network: dict = {"intra_region": {"latency": "0.05ms", "bandwidth": "100Gbps"}}
    if inter is not None:
        lat, bw = inter.split()
        network["inter_region"] = {"latency": lat, "bandwidth": bw}
    return ClusterSpec.from_dict({"name": "two-regions", "hosts": [
        {"name": "a", "gpus": {"type": a_type, "count": 4}, "region": "east"},
        {"name": "b", "gpus": {"type": b_type, "count": 4}, "region": "west"}], "network": network})


def workload(mode: str = "sync", algorithm: str = "grpo", response: dict | None = None, model: str = MODEL,
             reward: bool = False, **extra) -> WorkloadSpec:
    models = {"actor": model}
    if algorithm == "ppo":
        models["critic"] = model
    if reward:
        models["reward"] = model
    return WorkloadSpec.from_dict({
        "name": f"{algorithm}-{mode}", "algorithm": algorithm, "mode": mode, "models": models,
        "prompts_per_step": 16, "responses_per_prompt": 4,
        "prompt_len": {"mean": 128, "max": 256},
        "response_len": response or {"mean": 256, "max": 1024, "dist": "lognormal", "std": 200},
        "training": {"recompute": True}, **extra})


A = tuple(f"a:{i}" for i in range(4))
B = tuple(f"b:{i}" for i in range(4))


def layouts(sim: Simulator, where: dict[str, tuple[str, ...]], tp: int = 1) -> dict[str, TaskLayout]:
    layers = build_graph(sim.workload).model_of("actor_gen").layers
    return {t: even_layout(t, where[t], tp, 1, layers) for t in sim.tasks}


def colocated(sim: Simulator, devices: tuple[str, ...] = A + B) -> Candidate:
    return Candidate([tuple(sim.tasks)], [devices], layouts(sim, dict.fromkeys(sim.tasks, devices)))


def split(sim: Simulator, gen: tuple[str, ...] = B, rest: tuple[str, ...] = A) -> Candidate:
    others = tuple(t for t in sim.tasks if t != "actor_gen")
    where = {t: rest for t in others} | {"actor_gen": gen}
    return Candidate([("actor_gen",), others], [gen, rest], layouts(sim, where))


@pytest.fixture(scope="module")
def cm():
    return get_cost_model("analytical")


def sim_for(cm, wl=None, cl=None, **kw) -> Simulator:
    return Simulator(cl or cluster(), wl or workload(), cm, **kw)


def test_graph_follows_the_algorithm():
    grpo = build_graph(workload())
    # rule-based reward: no reward_infer; the old-log-prob recompute on by default
    assert grpo.tasks == ("actor_gen", "actor_logprob", "ref_infer", "actor_train")
    ppo = build_graph(workload(algorithm="ppo", reward=True))
    assert ppo.tasks == ("actor_gen", "actor_logprob", "ref_infer", "reward_infer", "critic_infer", "actor_train",
                         "critic_train")
    names = {e.name for e in ppo.edges}
    assert "rollouts:actor_gen->critic_infer" in names and "scores:critic_infer->critic_train" in names
    assert {e.name for e in ppo.backward_edges()} == {"weights:actor_train->actor_gen",
                                                       "weights:critic_train->critic_infer"}
    order = {t: i for i, t in enumerate(ppo.tasks)}
    assert all(order[e.src] < order[e.dst] for e in ppo.edges if not e.backward)


def test_colocated_tasks_run_one_after_another(cm):
    sim = sim_for(cm)
    s = sim.evaluate(colocated(sim))
    assert s.feasible, s.violations
    assert s.iteration_s >= sum(s.task_seconds.values()) * (1 - 1e-9)
    bars = sorted((e.start, e.end) for e in s.timeline if e.kind == "compute")
    assert len(bars) == len(sim.graph.tasks)  # the log-prob pass, placed beside actor_train, included
    assert all(a_end <= b_start + 1e-9 for (_, a_end), (b_start, _) in zip(bars, bars[1:], strict=False))


def test_separate_groups_overlap_when_dependencies_allow(cm):
    sim = sim_for(cm, workload(mode="async"))
    s = sim.evaluate(split(sim))
    assert s.feasible, s.violations
    assert s.iteration_s < sum(s.task_seconds.values())
    gen = [e for e in s.timeline if e.kind == "compute" and e.group == 0]
    train = [e for e in s.timeline if e.kind == "compute" and e.group == 1 and e.name.startswith("actor_train")]
    assert any(g.start < t.end and t.start < g.end for g in gen for t in train), "generation and training overlap"
    assert any("(step +1)" in g.name for g in gen)  # it is the next step's generation that overlaps
    assert {e.kind for e in s.timeline} >= {"compute", "transfer", "weights"}
    assert all(0 <= e.start <= e.end <= s.iteration_s + 1e-9 for e in s.timeline)


def test_streaming_lets_the_next_stage_start_on_finished_samples(cm):
    on, off = sim_for(cm, streaming=True), sim_for(cm, streaming=False)
    s_on, s_off = on.evaluate(split(on)), off.evaluate(split(off))
    assert s_on.iteration_s < s_off.iteration_s
    first = next(e for e in s_on.timeline if e.name == "actor_logprob")  # the group's first consumer
    gen = next(e for e in s_on.timeline if e.name == "actor_gen")
    assert first.start < gen.end


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_slower_link_never_makes_a_plan_faster(cm, mode):
    wl = workload(mode=mode, algorithm="ppo", reward=True)
    speeds = ["1ms 25Gbps", "10ms 5Gbps", "30ms 1Gbps", "60ms 0.5Gbps"]
    sims = [sim_for(cm, wl, cluster(s)) for s in speeds]
    base = sims[0]
    half_a, half_b = A[:2] + B[:2], A[2:] + B[2:]
    candidates = [colocated(base), split(base), split(base, gen=A, rest=B),
                  split(base, gen=half_a, rest=half_b), colocated(base, A[:2] + B[:2])]
    for cand in candidates:
        times = [s.evaluate(cand).iteration_s for s in sims]
        assert all(math.isfinite(t) for t in times), [s.evaluate(cand).violations for s in sims]
        assert all(x <= y * (1 + 1e-9) for x, y in zip(times, times[1:], strict=False)), times
    spread = [s.evaluate(split(base, gen=half_a, rest=half_b)).iteration_s for s in (sims[0], sims[-1])]
    assert spread[1] > spread[0]  # a placement across regions does feel the link


def test_async_steady_state_is_never_slower_than_sync(cm):
    for algorithm in ("grpo", "ppo"):
        sync = sim_for(cm, workload("sync", algorithm))
        asyncs = [sim_for(cm, workload("async", algorithm, staleness=k)) for k in (1, 2)]
        for make in (colocated, split, lambda s: split(s, gen=A, rest=B)):
            t_sync = sync.evaluate(make(sync)).iteration_s
            for a in asyncs:
                assert a.evaluate(make(a)).iteration_s <= t_sync * (1 + 1e-9)
        t_sync = sync.evaluate(split(sync)).iteration_s
        t_async = asyncs[0].evaluate(split(asyncs[0])).iteration_s
        assert t_async < t_sync  # generation of step i+1 really overlaps training of step i
        s = asyncs[0].evaluate(split(asyncs[0]))
        gen, rest = s.task_seconds["actor_gen"], sum(v for k, v in s.task_seconds.items() if k != "actor_gen")
        assert t_async >= max(gen, rest) * (1 - 1e-9)  # never faster than the slower side


def test_memory_violations_are_found_and_readable(cm):
    sim = sim_for(cm, workload(model="qwen3-8b"), cluster(b_type="L4"))
    cand = split(sim, gen=A, rest=B)  # an 8B model trained with TP1 on 24 GB L4s
    s = sim.evaluate(cand)
    assert not s.feasible and math.isinf(s.iteration_s)
    text = " ".join(s.violations)
    assert "actor_train" in text and "L4" in text and "GB" in text
    assert sim.objective_value(s, "throughput") == math.inf


def test_colocated_tasks_that_do_not_fit_together_offload(cm):
    wl = workload(model="qwen3-4b")
    sim = sim_for(cm, wl, cluster(a_type="A100-40GB", b_type="A100-40GB"))
    s = sim.evaluate(Candidate([tuple(sim.tasks)], [A + B], layouts(sim, dict.fromkeys(sim.tasks, A + B), tp=2)))
    assert s.feasible, s.violations
    assert s.offload_s and all(v > 0 for v in s.offload_s.values())
    small = sim_for(cm)
    s_small = small.evaluate(colocated(small))
    assert not s_small.offload_s  # 0.6B states all stay resident next to each other


def test_long_tail_lengths_cost_more_than_fixed_ones_of_the_same_mean(cm):
    fixed = sim_for(cm, workload(response={"mean": 256, "max": 1024, "dist": "fixed"}))
    tail = sim_for(cm, workload(response={"mean": 256, "max": 1024, "dist": "lognormal", "std": 300}))
    assert tail.costs.basis.lengths.mean() <= 256 + 1e-9  # clipping at the cap only lowers the tail's mean
    for make in (colocated, split):
        s_fixed, s_tail = fixed.evaluate(make(fixed)), tail.evaluate(make(tail))
        assert s_tail.task_seconds["actor_gen"] > s_fixed.task_seconds["actor_gen"]
        assert s_tail.iteration_s > s_fixed.iteration_s


def test_breakdown_is_the_critical_path_and_sums_to_the_iteration(cm):
    for wl in (workload(), workload("async", "ppo", reward=True)):
        sim = sim_for(cm, wl)
        for cand in (colocated(sim), split(sim), split(sim, gen=A, rest=B)):
            s = sim.evaluate(cand)
            assert sum(s.breakdown.values()) == pytest.approx(s.iteration_s, rel=0.02)
            assert s.bottleneck == max(s.breakdown, key=s.breakdown.get)


def test_cost_throughput_and_objectives(cm):
    sim = sim_for(cm)
    cand = split(sim)
    s = sim.evaluate(cand)
    price = sum(sim.cluster.price_per_hour(sim.devices[d].host) for d in cand.devices())
    assert s.price_per_hour == pytest.approx(price)
    assert s.cost_per_iteration == pytest.approx(price * s.iteration_s / 3600)
    assert s.throughput == pytest.approx(sim.workload.sequences_per_step / s.iteration_s)
    assert sim.objective_value(s, "throughput") == s.iteration_s
    assert sim.objective_value(s, "cost") == s.cost_per_iteration
    assert sim.objective_value(s, "throughput-under-budget", budget=price + 1) == s.iteration_s
    assert sim.objective_value(s, "throughput-under-budget", budget=price / 2) == math.inf
    with pytest.raises(ValueError):
        sim.objective_value(s, "speed")


def test_same_seed_same_score_and_memoised(cm):
    a, b = sim_for(cm, seed=3), sim_for(cm, seed=3)
    assert a.evaluate(split(a)).iteration_s == b.evaluate(split(b)).iteration_s
    assert a.evaluate(split(a)) is a.evaluate(split(a))
    assert a.evaluations == 1


def test_malformed_candidates_are_explained(cm):
    sim = sim_for(cm)
    good = split(sim)
    lay = good.layout("actor_gen")
    bad_shares = good.replace_layout(TaskLayout(lay.task, 1, 1, lay.replicas, (0.5,) * lay.dp, lay.layer_splits))
    bad_split = good.replace_layout(TaskLayout(lay.task, 1, 1, lay.replicas, lay.shares, ((10,),) * lay.dp))
    stolen = Candidate(good.groups, [good.group_devices[0], good.group_devices[1] + ("b:0",)], good.layout_map())
    missing = Candidate([("actor_gen",)], [B], {"actor_gen": lay})
    foreign = good.replace_layout(even_layout("actor_gen", ("a:0",), 1, 1, LAYERS))
    cases = {bad_shares: "sum to", bad_split: "layer split", stolen: "groups must not share",
             missing: "ref_infer is in 0 groups", foreign: "not a device of its group"}
    for cand, phrase in cases.items():
        s = sim.evaluate(cand)
        assert not s.feasible and any(phrase in v for v in s.violations), s.violations


def test_regions_without_a_link_are_infeasible_up_front(cm):
    with pytest.raises(InfeasibleError, match=r"east <-> west.*inter_region"):
        sim_for(cm, cl=cluster(inter=None))


def test_a_model_that_fits_on_no_gpu_is_reported(cm):
    cl = ClusterSpec.from_dict({"name": "small", "hosts": [{"name": "l", "gpus": {"type": "L4", "count": 2}}]})
    sim = Simulator(cl, workload(model="qwen3-14b"), cm)
    with pytest.raises(InfeasibleError, match=r"actor_gen \(qwen3-14b\) fits on no GPU"):
        sim.check_fits(max_tp=1, max_pp=1)
    Simulator(cl, workload(), cm).check_fits(max_tp=1, max_pp=1)  # 0.6B fits


def test_measured_links_override_the_spec(cm, db_path):
    from hetprof.profiles import ProfileDB

    with ProfileDB(db_path) as db:
        db.add_link(src_host="a", dst_host="b", src_region="east", dst_region="west", alpha_s=0.2,
                    beta_Bps=1e6, residual=0.0)
        measured = sim_for(cm, db=db)
    spec = sim_for(cm)
    nominal = 5e9 / 8  # a spec link is priced at the catalog's inter-host goodput of its nominal rate
    assert measured.link("a:0", "b:3").beta_Bps == 1e6
    assert spec.link("a:0", "b:3").beta_Bps == pytest.approx(nominal * spec.catalog.inter_host(nominal))
    assert measured.evaluate(split(measured)).iteration_s > spec.evaluate(split(spec)).iteration_s
    with pytest.raises(InfeasibleError, match="not part of cluster"):
        spec.link("a:0", "zz:0")


def test_pipeline_and_uneven_replicas_are_priced(cm):
    sim = sim_for(cm, workload(model="qwen3-4b"))
    seconds = {pp: sim.replica_seconds("actor_train", A[:pp], 1, pp, 16) for pp in (1, 2, 4)}
    assert all(math.isfinite(s) and s > 0 for s in seconds.values())
    # a stage split that loads one stage more is slower than an even one
    even = sim.replica_seconds("actor_train", A[:2], 1, 2, 16, (18, 18))
    skewed = sim.replica_seconds("actor_train", A[:2], 1, 2, 16, (30, 6))
    assert skewed > even
    # a slower GPU takes longer for the same work, and a pipeline across regions pays the link
    assert sim.replica_seconds("ref_infer", B[:1], 1, 1, 16) > sim.replica_seconds("ref_infer", A[:1], 1, 1, 16)
    assert sim.replica_seconds("actor_gen", (A[0], B[0]), 1, 2, 16) > sim.replica_seconds("actor_gen", A[:2], 1, 2, 16)


def test_same_host_links_use_the_profiled_collectives_where_measured(db_path):
    """Weight sync between colocated devices is priced with this host's measured collectives (slow
    gloo on CPU slots), not the datasheet's intra-node link."""
    from hetprof.profiles import DeviceInfo, ProfileDB

    cpu = ClusterSpec.from_dict({"name": "cpu", "hosts": [{"name": "h", "gpus": {"type": "cpu", "count": 2}}]})
    with ProfileDB(db_path) as db:
        dev = db.add_device(DeviceInfo(name="cpu", kind="cpu", catalog_type="cpu", host="h"))
        samples = [{"params": {"backend": "gloo", "world": 2, "size_bytes": size},
                    "metrics": {"seconds": 1e-3 + size / 1e9}} for size in (1e3, 1e5, 1e7) for _ in range(3)]
        db.add_benchmark("collective.broadcast", dev, "h", {"backend": "gloo"}, samples)
        measured_cm = get_cost_model("analytical", db=db)
        measured = Simulator(cpu, workload(model="tiny"), measured_cm, db=db)
    spec = Simulator(cpu, workload(model="tiny"), get_cost_model("analytical"))
    assert spec.link("h:0", "h:1").alpha_s == pytest.approx(5e-6)
    link = measured.link("h:0", "h:1")
    assert link.alpha_s == pytest.approx(1e-3, rel=0.05) and link.beta_Bps == pytest.approx(1e9, rel=0.05)
