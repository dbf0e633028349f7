"""The Gantt chart's group labels name every task with a bar in the group."""

from __future__ import annotations

from hetprof.planner.candidate import Candidate
from hetprof.planner.gantt import group_label
from hetprof.planner.schedule import Event


def test_a_group_label_names_the_log_prob_pass_placed_beside_its_trainer():
    """actor_logprob is no task of the candidate's groups (the simulator places it beside actor_train), yet
    its bar is drawn in that group: the label names it, before its trainer, and nothing is cut off."""
    candidate = Candidate([("actor_gen",), ("ref_infer", "actor_train")], [("a:0",), ("a:1",)], {})
    events = [Event("actor_gen", ("a:0",), 0.0, 1.0, "compute", 0),
              Event("actor_logprob (step -1)", ("a:1",), 0.0, 0.2, "compute", 1),
              Event("actor_logprob", ("a:1",), 1.0, 1.2, "compute", 1),
              Event("ref_infer", ("a:1",), 1.2, 1.4, "compute", 1),
              Event("weights:actor_train->actor_gen", ("a:1",), 2.0, 2.1, "weights", 1),
              Event("actor_train", ("a:1",), 1.4, 2.0, "compute", 1)]
    assert group_label(candidate, events, 0) == "group 0: actor_gen"
    label = group_label(candidate, events, 1)
    assert label.replace("\n", " ") == "group 1: ref_infer, actor_logprob, actor_train"
    assert all(len(line) <= 44 for line in label.splitlines())
