"""hetrl converges: paced by evaluations (a budget is a prefix of a larger one), deterministic with
worker processes, reports progress, finds cheap sub-pools, and shares one study across processes."""

from __future__ import annotations

import json
import math
import subprocess

import yaml
from helpers.commands import hetprof_cmd
from test_planner_search_properties import cluster_from, small_sim, workload

from hetprof.costmodels import get_cost_model
from hetprof.planner.search import SearchContext, get_search
from hetprof.planner.search.hetrl import HetRLConfig
from hetprof.planner.simulator import Simulator

STRUCTURED = HetRLConfig(enumerate_limit=0, milp_arms=False)   # the large-cluster path, on a small one


def geo_sim(hosts=None, mode: str = "sync") -> Simulator:
    hosts = hosts or [("A100-40GB", 2, "us"), ("L40S", 2, "us"), ("A100-40GB", 2, "eu"), ("L4", 2, "eu")]
    return Simulator(cluster_from(hosts), workload("grpo", mode, "qwen3-0.6b", 16), get_cost_model("analytical"))


def hetrl(sim: Simulator, **kw):
    return get_search("hetrl")(SearchContext(planning=sim.planning, seed=kw.pop("seed", 5), max_pp=2, time_budget_s=600,
                                             **kw)).run()


def test_a_smaller_evaluation_budget_does_a_prefix_of_the_same_work():
    """Pacing by evaluations: N evaluations are the first N of a 2N run, so more budget never
    gives a worse plan and a slower machine only takes longer to the same plan."""
    short = hetrl(geo_sim(), max_evals=300, config=STRUCTURED)
    long = hetrl(geo_sim(), max_evals=600, config=STRUCTURED)
    assert short.evaluations == 300 and long.evaluations == 600
    head = [p for p in long.trace if p["evals"] <= 300]
    assert [(p["best"], p["evals"]) for p in short.trace] == [(p["best"], p["evals"]) for p in head]
    assert long.objective_value <= short.objective_value


def test_two_worker_processes_repeat_and_match_one():
    runs = [hetrl(geo_sim(), max_evals=400, config=STRUCTURED, workers=w) for w in (2, 2, 1)]
    assert runs[0].candidate == runs[1].candidate and runs[0].objective_value == runs[1].objective_value
    assert runs[0].candidate == runs[2].candidate
    assert all(r.evaluations == 400 for r in runs)


def test_progress_reports_best_so_far_evaluations_and_time():
    seen = []
    res = hetrl(small_sim(), max_evals=200, progress=seen.append)
    assert seen and all(p.max_evals == 200 for p in seen)
    assert [p.evaluations for p in seen] == sorted(p.evaluations for p in seen)
    assert [p.elapsed_s for p in seen] == sorted(p.elapsed_s for p in seen)
    finite = [p.best for p in seen if math.isfinite(p.best)]
    assert finite == sorted(finite, reverse=True) and finite[-1] == res.objective_value


def sub_cluster(hosts, keep) -> Simulator:
    return geo_sim([h for h in hosts if keep(h)])


def test_cost_objective_is_no_worse_than_any_one_region_or_gpu_type():
    """The sub-pools a user would try by hand (a region, a GPU type) are searched alone as well,
    each with the same evaluation budget as a search of that sub-pool on its own."""
    hosts = [("A100-40GB", 2, "us"), ("A100-40GB", 2, "us"), ("L40S", 2, "eu"), ("H100", 2, "eu")]
    full = hetrl(geo_sim(hosts), max_evals=300, objective="cost")
    assert set(full.extra["sub_pools"]) == {"region eu", "region us", "type H100-SXM", "type L40S"}  # A100s: us
    subsets = [lambda h: h[2] == "us", lambda h: h[2] == "eu", lambda h: h[0] == "A100-40GB",
               lambda h: h[0] == "L40S", lambda h: h[0] == "H100"]
    for keep in subsets:
        part = hetrl(sub_cluster(hosts, keep), max_evals=300, objective="cost")
        assert full.score.cost_per_iteration <= part.score.cost_per_iteration * (1 + 1e-6), keep


def write_problem(tmp_path):
    hosts = [("A100-40GB", 2, "us"), ("L4", 2, "us"), ("L40S", 1, "eu")]
    cluster = cluster_from(hosts).to_dict()
    work = workload("grpo", "sync", "qwen3-0.6b", 16).to_dict()
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster))
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(work))


def plan_cmd(tmp_path, storage: str, seed: int, evals: int, out: str) -> list[str]:
    return [*hetprof_cmd(), "plan", "-c", str(tmp_path / "c.yaml"), "-w", str(tmp_path / "w.yaml"),
            "--max-pp", "2", "--max-evals", str(evals), "--search-seed", str(seed), "--workers", "1",
            "--storage", storage, "--out", str(tmp_path / out)]


def test_two_processes_share_one_study_and_one_best_answer(tmp_path):
    import optuna

    write_problem(tmp_path)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    procs = [subprocess.Popen(plan_cmd(tmp_path, storage, seed, 400, f"p{seed}.json"), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for seed in (0, 1)]
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out
    names = optuna.study.get_all_study_names(storage)
    assert len(names) == 1                                  # one study, whatever the search seeds
    trials = optuna.load_study(study_name=names[0], storage=storage).trials
    assert len({t.user_attrs.get("process") for t in trials}) == 2
    plans = [json.loads((tmp_path / f"p{s}.json").read_text()) for s in (0, 1)]
    assert [p["search_evaluations"] for p in plans] == [400, 400]     # the effort, in the plan file
    values = [p["predicted"]["iteration_s"] for p in plans]
    # a third process on the same storage starts from everything both stored: the study's best
    third = subprocess.run(plan_cmd(tmp_path, storage, 2, 20, "p2.json"), capture_output=True, text=True,
                           timeout=600)
    assert third.returncode == 0, third.stdout + third.stderr
    best = json.loads((tmp_path / "p2.json").read_text())["predicted"]["iteration_s"]
    assert best <= min(values) * (1 + 1e-9)
