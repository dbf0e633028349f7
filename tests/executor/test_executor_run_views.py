"""What a run shows beside its log: the measured Gantt, the progress bar and the torch.profiler trace."""

from __future__ import annotations

import io

import pytest
from click.testing import CliRunner
from rich.console import Console
from test_executor_run_record import context, reports

from hetprof.errors import HetprofError
from hetprof.executor.records.measured_gantt import (
    legend_handles,
    measured_bars,
    pick_iteration,
    predicted_bars,
    save_measured_gantt,
)
from hetprof.executor.records.progress import RunProgress, wanted
from hetprof.executor.records.run_log import RunLog, read_db, write_db
from hetprof.executor.records.run_record import build_record, timeline
from hetprof.executor.records.trace import IterationTrace, skipped_steps


def timed_reports(shift: float = 0.0):
    """The run-record fixture's reports with wall-clock spans: generation on h:0, then the leader's work."""
    gen, leader, other = reports()
    t = 1000.0 + shift
    gen.spans = {"actor_gen": [t, t + 1.2], "weight_sync": [t + 2.0, t + 2.4]}
    leader.spans = {"wait_rollouts": [t, t + 1.25], "ref_infer": [t + 1.25, t + 1.45],
                    "actor_train": [t + 1.5, t + 2.1], "weight_sync": [t + 2.1, t + 2.15]}
    other.spans = {"actor_train": [t + 1.5, t + 2.4]}
    return [gen, leader, other]


def records(n: int = 3) -> list[dict]:
    return [build_record(context(), i, 2.0 + 0.1 * i, timed_reports(i * 10.0), 1, float(i)) for i in range(n)]


def test_timeline_is_every_ranks_spans_from_the_iterations_first_start():
    spans = timeline(timed_reports())
    assert spans[0] == {"device": "h:0", "task": "actor_gen", "start": 0.0, "end": pytest.approx(1.2)}
    train = [s for s in spans if s["task"] == "actor_train"]
    assert {s["device"] for s in train} == {"h:1", "h:2"} and all(s["start"] == pytest.approx(1.5) for s in train)
    assert len(spans) == 7


def test_predicted_bars_follow_the_dataflow_on_the_plans_devices():
    bars = {(b["task"], b["device"]): (b["start"], b["end"]) for b in predicted_bars(records(1)[0])}
    # the fixture's plan: actor_gen 1.0 s on h:0, actor_train 0.5 s on h:1+h:2, the sync 0.1 s into h:0
    assert bars[("actor_gen", "h:0")] == (0.0, 1.0)
    assert bars[("actor_train", "h:1")] == bars[("actor_train", "h:2")] == (1.0, 1.5)
    assert bars[("weight_sync", "h:0")] == (1.5, pytest.approx(1.6))


def test_validate_gantt_refuses_a_missing_iteration_or_an_unknown_format_as_bad_input(tmp_path):
    from hetprof.cli import cli

    log = RunLog(tmp_path / "run.jsonl")
    for rec in records(3):
        log.write(rec)
    base = ["--db", str(tmp_path / "p.db"), "validate", str(tmp_path / "run.jsonl"), "--gantt"]
    missing = CliRunner().invoke(cli, [*base, str(tmp_path / "x.png"), "--iteration", "7"])
    assert missing.exit_code == 2 and "--iteration 7" in missing.output and not (tmp_path / "x.png").exists()
    unknown_format = CliRunner().invoke(cli, [*base, str(tmp_path / "run.xyz")])
    assert unknown_format.exit_code == 2 and "--gantt" in unknown_format.output


def test_legend_names_every_span_drawn_once_with_its_style():
    handles = legend_handles(measured_bars(records(1)[0]))
    assert [h.get_label() for h in handles] == ["actor_gen", "wait_rollouts", "ref_infer", "actor_train",
                                                "weight_sync"]
    assert handles[-1].get_hatch() == "///"  # a sync edge is hatched, as in the picture


def test_gantt_draws_the_median_iteration_from_the_log_and_from_the_database(tmp_path):
    recs = records(3)
    assert pick_iteration(recs, skip=1, iteration=None)["iteration"] == 1  # median of iterations 1, 2
    assert measured_bars(pick_iteration(recs, 1, 2)) == recs[2]["timeline"]
    png = save_measured_gantt(recs, tmp_path / "out" / "run.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    write_db(tmp_path / "p.db", recs)
    back = read_db(tmp_path / "p.db", "run-x")
    assert [r["timeline"] for r in back] == [r["timeline"] for r in recs]
    assert predicted_bars(back[0]) == predicted_bars(recs[0])  # devices come back from the task rows
    with pytest.raises(HetprofError, match="--iteration 7"):
        pick_iteration(recs, 1, 7)
    with pytest.raises(HetprofError, match="no task timeline"):
        pick_iteration([{k: v for k, v in r.items() if k != "timeline"} for r in recs], 1, None)


def test_progress_bar_counts_iterations_and_shows_reward_and_throughput():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    assert wanted(console, quiet=False) and not wanted(console, quiet=True)
    assert not wanted(Console(file=io.StringIO()), quiet=False)  # not a terminal: lines only
    bar = RunProgress(console, first=2, total=10)
    bar.advance({"iteration": 4, "reward_mean": 0.625, "tokens_per_s": 1234.4})
    assert bar.fields == {"completed": 5, "total": 10, "reward": "0.625", "tokens_per_s": "1234"}
    bar.close()
    assert "5/10" in out.getvalue() and "0.625" in out.getvalue()


@pytest.mark.parametrize(("steps", "traced", "skipped"), [(5, 2, 1), (3, 2, 1), (2, 2, 0), (2, 3, 0), (1, 1, 0)])
def test_trace_skips_the_first_step_only_when_the_run_has_room_for_it(steps, traced, skipped):
    assert skipped_steps(steps, min(steps, traced)) == skipped


def test_no_trace_dir_profiles_nothing(tmp_path):
    with IterationTrace(None, 0, 3, 2) as trace, trace.step("x"):
        pass
    assert not trace.enabled and not list(tmp_path.iterdir())
