"""A shared Optuna storage (`hetprof plan --storage`) is someone else's data: its trials' stored
candidates are read bounded and typed, and one naming devices this cluster lacks is skipped."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from hetprof.cli import cli
from hetprof.planner.candidate import Candidate
from hetprof.planner.search.space import MAX_CANDIDATE_CHARS, decode_candidate, encode_candidate
from hetprof.planner.search.study import best_candidates
from hetprof.specs.layout import TaskLayout

ROOT = Path(__file__).resolve().parents[2]
DEVICES = ("h0:0", "h0:1")


def _good() -> str:
    lay = TaskLayout("actor_gen", 1, 1, (("h0:0",), ("h0:1",)), (0.5, 0.5), ((4,), (4,)))
    return encode_candidate(Candidate((("actor_gen",),), (DEVICES,), {"actor_gen": lay}))


def _bad_texts() -> dict[str, object]:
    good = json.loads(_good())
    unknown = json.loads(_good())
    unknown["group_devices"] = [["elsewhere:7", "h0:1"]]
    wrong = json.loads(_good())
    wrong["layouts"]["actor_gen"]["tp"] = "2"
    return {"deep": "[" * 5_000 + "]" * 5_000, "huge": " " * (MAX_CANDIDATE_CHARS + 1),
            "infinite": json.dumps(good, separators=(",", ":")).replace('"shares":[0.5', '"shares":[Infinity'),
            "not text": 12, "wrong type": json.dumps(wrong), "unknown device": json.dumps(unknown),
            "not json": "{", "a list": "[]"}


@pytest.mark.parametrize("name", list(_bad_texts()))
def test_a_stored_candidate_that_is_not_one_of_this_cluster_is_refused_in_one_line(name):
    with pytest.raises(ValueError) as err:
        decode_candidate(_bad_texts()[name], DEVICES)
    assert "\n" not in str(err.value)


def test_a_good_stored_candidate_reads_back_equal():
    assert encode_candidate(decode_candidate(_good(), DEVICES)) == _good()


def test_the_best_trials_skip_what_is_not_a_candidate_of_this_cluster():
    trials = [optuna.trial.create_trial(value=float(i), user_attrs={"candidate": text})
              for i, text in enumerate(_bad_texts().values())]
    trials.append(optuna.trial.create_trial(value=99.0, user_attrs={"candidate": _good()}))
    assert [encode_candidate(c) for c in best_candidates(trials, DEVICES, k=len(trials))] == [_good()]


def test_hetprof_plan_resumes_a_shared_study_with_planted_trials(tmp_path):
    """The same search twice on one storage, with hostile trials planted in every study between."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    args = ["plan", "-c", str(ROOT / "examples/clusters/cpu-local.yaml"), "-w", str(ROOT / "examples/workloads/grpo-tiny.yaml"),
            "--max-evals", "40", "--storage", url, "--db", str(tmp_path / "p.db")]
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    summaries = optuna.get_all_study_summaries(url)
    assert summaries
    for summary in summaries:
        study = optuna.load_study(study_name=summary.study_name, storage=url)
        arms = {t.user_attrs.get("arm") for t in study.trials} - {None}  # resumed by arm: plant under real ones
        for text in _bad_texts().values():
            if isinstance(text, str) and len(text) < 200_000:  # what an RDB user attribute can hold
                for arm in sorted(arms) or ["x"]:
                    study.add_trial(optuna.trial.create_trial(value=-1.0, user_attrs={"candidate": text, "arm": arm}))
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0, again.output
    assert "Traceback" not in again.output


def test_a_stored_expert_layout_keeps_its_degrees():
    """Parallel searches hand candidates back as text: an MoE layout's ep and whole experts survive it."""
    lay = TaskLayout("actor_train", 1, 1, (("h0:0",), ("h0:1",)), (0.5, 0.5), ((4,), (4,)), ep=2)
    folded = TaskLayout("actor_train", 2, 1, (DEVICES,), (1.0,), ((4,),), etp=1)
    for layout in (lay, folded):
        cand = Candidate((("actor_train",),), (DEVICES,), {"actor_train": layout})
        assert decode_candidate(encode_candidate(cand), DEVICES) == cand
