"""The one layout type (hetprof.specs.TaskLayout): derived views, validation naming the field, its
plan-file form, and plan files written before it existed.

`data/plan-before-one-layout.json` was written by commit efc3604's `to_plan` (the planner's own
TaskLayout converted to the plan's Layout/Tasklet pieces): a generation task whose replicas differ
in TP, a two-stage zero2 trainer with two replicas and its log-prob follower.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hetprof.errors import SpecError
from hetprof.planner.candidate import Candidate
from hetprof.specs import Plan, TaskLayout
from hetprof.specs.layout import EXTRA_DEGREES, layout_name

OLD_PLAN = Path(__file__).parent / "data" / "plan-before-one-layout.json"

MIXED = TaskLayout("actor_gen", 2, 1, (("a:0",), ("a:1", "a:2")), (0.4, 0.6), ((36,), (36,)))
PIPED = TaskLayout("actor_train", 2, 2, (("a:0", "a:1", "a:2", "a:3"), ("b:0", "b:1", "b:2", "b:3")), (0.5, 0.5),
                   ((17, 19), (17, 19)), "zero2")


def test_derived_views_of_a_pipelined_sharded_layout():
    lay = PIPED
    assert (lay.dp, lay.tp, lay.pp, lay.world, lay.tp_degrees(), lay.tp_varies) == (2, 2, 2, 8, (2, 2), False)
    assert lay.stage_devices(1, 1) == ("b:2", "b:3") and lay.layer_range(1, 1) == (17, 36)
    assert lay.devices()[:4] == ("a:0", "a:1", "a:2", "a:3")
    assert str(lay) == lay.describe() == "DP2×TP2×PP2 zero2"
    lay.validate()


def test_replicas_of_different_tp_each_take_their_own():
    assert [MIXED.tp_of(r) for r in range(MIXED.dp)] == [1, 2] and MIXED.tp_varies
    assert MIXED.stage_devices(1, 0) == ("a:1", "a:2")
    assert MIXED.describe() == "DP2(1×TP1+1×TP2)×PP1" == layout_name([1, 2], 1)
    MIXED.validate()


def test_extra_degrees_default_to_one_and_appear_in_the_name_only_when_set():
    assert all(getattr(PIPED, k) == 1 for k in EXTRA_DEGREES)
    cp2 = dataclasses.replace(PIPED, tp=1, cp=2)  # the same devices: each stage is TP1 × CP2
    assert cp2.tp_degrees() == (1, 1) and str(cp2) == "DP2×TP1×PP2 zero2 CP2"
    cp2.validate()
    assert cp2.stage_devices(0, 1) == ("a:2", "a:3") and cp2.layer_range(0, 1) == (17, 36)


@pytest.mark.parametrize("change, field, expected", [
    (dict(tp=0), "tp", "a positive integer"),
    (dict(ep=3), "ep", "a divisor of dp = 2"),
    (dict(sp=0), "sp", "a positive integer"),
    (dict(sharding="zero9"), "sharding", "one of none, zero1, zero2, fsdp"),
    (dict(replicas=()), "replicas", "at least one replica"),
    (dict(replicas=(("a:0", "a:1", "a:2"), ("b:0", "b:1", "b:2", "b:3"))), "replicas[0]", "pp × cp"),
    (dict(tp=4), "tp", "the largest replica's TP degree (2)"),
    (dict(shares=(0.5, 0.4)), "shares", "summing to 1"),
    (dict(shares=(1.0,)), "shares", "one fraction in [0, 1] per replica"),
    (dict(layer_splits=((17, 19),)), "layer_splits", "one split per replica"),
    (dict(layer_splits=((17, 19), (36, 0))), "layer_splits[1]", "2 positive layer counts"),
])
def test_validation_names_the_field(change, field, expected):
    with pytest.raises(SpecError) as err:
        dataclasses.replace(PIPED, **change).validate()
    assert err.value.field == field and expected in err.value.expected


@pytest.mark.parametrize("lay", [MIXED, PIPED, dataclasses.replace(PIPED, ep=2, sp=2, tp=1, cp=2)])
def test_json_round_trip(lay):
    data = json.loads(json.dumps(lay.to_dict()))
    assert TaskLayout.from_dict(lay.task, data) == lay


def test_the_file_form_is_the_plan_files_and_extra_degrees_are_written_only_when_set():
    data = PIPED.to_dict()
    assert data["layout"] == {"dp": 2, "tp": 2, "pp": 2, "sharding": "zero2"}
    assert data["tasklets"][3] == {"replica": 1, "stage": 1, "devices": ["b:2", "b:3"], "layer_start": 17,
                                   "layer_end": 36, "batch_share": 0.5}
    assert MIXED.to_dict()["layout"]["replica_tp"] == [1, 2]
    ep = dataclasses.replace(PIPED, ep=2).to_dict()["layout"]
    assert list(ep) == ["dp", "tp", "pp", "sharding", "ep"] and ep["ep"] == 2


@pytest.mark.parametrize("edit, field, expected", [
    (lambda d: d["tasklets"].pop(), "tasklets", "dp × pp = 4 tasklets"),
    (lambda d: d["tasklets"][1].update(stage=0), "tasklets[1]", "one tasklet per replica and stage"),
    (lambda d: d["tasklets"][2].update(replica=2), "tasklets[2].replica", "a replica index below dp = 2"),
    (lambda d: d["tasklets"][1].update(layer_start=18), "tasklets", "holding layers contiguously from 0"),
    (lambda d: d["tasklets"][1].update(batch_share=0.4), "tasklets[1].batch_share", "replica 0's share"),
    (lambda d: d["tasklets"][0].update(devices=["a:0"]), "tasklets[0].devices", "tp = 2 devices"),
    (lambda d: d["layout"].update(sp=3), "layout.sp", "a divisor of dp = 2"),
    (lambda d: d["layout"].update(cp=0), "layout.cp", "a positive integer"),
])
def test_a_bad_file_form_names_the_entry_field(edit, field, expected):
    data = json.loads(json.dumps(PIPED.to_dict()))
    edit(data)
    with pytest.raises(SpecError) as err:
        TaskLayout.from_dict(PIPED.task, data, file="plan.json")
    assert err.value.field == field and expected in err.value.expected and "plan.json" in str(err.value)


def test_a_plan_written_before_the_one_layout_type_loads_and_saves_byte_identical(tmp_path):
    plan = Plan.load(OLD_PLAN)
    gen, train = plan.task("actor_gen").layout, plan.task("actor_train").layout
    assert gen.tp_degrees() == (1, 2) and gen.shares == (0.4, 0.6)
    assert (train.dp, train.pp, train.sharding, train.layer_splits) == (2, 2, "zero2", ((17, 19), (17, 19)))
    assert plan.task("actor_logprob").layout == dataclasses.replace(train, task="actor_logprob", sharding="none")
    plan.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == OLD_PLAN.read_bytes()


def test_a_plans_candidate_holds_the_plans_own_layouts():
    plan = Plan.load(OLD_PLAN)
    cand = Candidate.of_plan(plan)
    assert "actor_logprob" not in cand.tasks()  # followers are placed beside their leaders by the simulator
    assert all(cand.layout(t) is plan.task(t).layout for t in cand.tasks())
