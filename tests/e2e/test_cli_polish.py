"""CLI polish: tables fit the terminal, `db show` summarises, one run naming, read-only commands create nothing."""

from __future__ import annotations

import json
import re
import time

import pytest
from helpers.cli import CLUSTER, NARROW, WORKLOAD, invoke, printed_names, write
from helpers.costmodels_synth import add_rows
from rich.console import Console

from hetprof.display import Col, fitted_table, natural_width, print_wide, when
from hetprof.profiles import DeviceInfo, ProfileDB

RUN_A = "run-0a1b2c3d-20261124T101500"
RUN_B = "run-0a1b2c3d-20261124T113000"  # same plan, later: shares RUN_A's first 20 characters
def records(run: str, iterations: int = 3) -> list[dict]:
    return [{"run": run, "plan_hash": "0a1b2c3d4e5f", "iteration": i, "task": task, "seconds": 1.0 + 0.1 * i,
             "predicted_s": 0.8, "host": "node0"}
            for i in range(iterations) for task in ("iteration", "actor_gen", "actor_train")]


@pytest.fixture(scope="module")
def filled_db(tmp_path_factory):
    """Task rows from the synthetic device, a fitted cost model, two runs of `hetprof run` and a link;
    built once, since every test here only reads it."""
    db_path = tmp_path_factory.mktemp("filled") / "profiles.db"
    with ProfileDB(db_path) as db:
        add_rows(db, models=("tiny", "tiny-2x"), batches=(1, 4), lengths=(16, 128), repeats=2)
        db.add_run_records(records(RUN_A) + records(RUN_B, 2))
        db.add_link("node0", "node1", 2e-3, 1.25e8, residual=0.01)
    assert invoke("--db", str(db_path), "fit", "--task", "task.decode").exit_code == 0
    return db_path


def test_a_table_wider_than_the_console_drops_columns_in_order_and_names_them():
    console = Console(width=40, file=None)
    cols = [Col("id"), Col("kept"), Col("second", drop=1), Col("first", drop=2)]
    rows = [["a" * 10, "b" * 8, "c" * 16, "d" * 14]]
    table = fitted_table(console, cols, rows)
    assert [c.header for c in table.columns] == ["id", "kept"]
    assert natural_width(console, table) <= 40
    assert "not shown at this width: second, first" in table.caption
    wide = fitted_table(console, cols, rows, wide=True)
    assert [c.header for c in wide.columns] == ["id", "kept", "second", "first"] and wide.caption is None
    with console.capture() as out:
        print_wide(console, wide, wide=True)
    assert "d" * 14 in out.get() and max(map(len, out.get().splitlines())) > 40
    assert console.width == 40  # printing wide leaves the console as it was


def test_markup_in_a_cell_is_shown_as_text():
    console = Console(width=80)
    with console.capture() as out:
        console.print(fitted_table(console, [Col("name")], [["[bold]x[/] [/]"]]))
    assert "[bold]x[/] [/]" in out.get()


def test_when_gives_a_local_date_and_how_long_ago():
    now = time.time()
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+ \(2 h ago\)", when(now - 7200, now=now))
    assert when(now, short=True) == time.strftime("%Y-%m-%d %H:%M", time.localtime(now))
    assert when(None) == "—"


def _lines_fit(output: str, width: int = NARROW) -> bool:
    """Every line within the width and no cell cut short (rich squeezes a table to fit by ending cells in …)."""
    return max(len(line) for line in output.splitlines()) <= width and not re.search(r"…\s*[│┃]", output)


def test_fit_fits_a_narrow_terminal_and_wide_shows_every_column(filled_db):
    res = invoke("--db", str(filled_db), "fit", "--no-store")
    assert res.exit_code == 0, res.output
    assert _lines_fit(res.output), res.output
    flat = " ".join(res.output.split())
    assert "not shown at this width:" in flat and "held-out" in flat and "analytical" in flat
    wide = invoke("--db", str(filled_db), "fit", "--no-store", "--wide")
    header = next(line for line in wide.output.splitlines() if "task" in line and "noise" in line)
    assert all(name in header for name in ("dtype", "samples", "from runs", "folds", "train", "noise"))


@pytest.mark.parametrize("args", [["db", "list"], ["db", "info"], ["db", "show", RUN_A], ["validate", RUN_A]])
def test_db_and_validate_tables_fit_a_narrow_terminal(filled_db, args):
    res = invoke("--db", str(filled_db), *args)
    assert res.exit_code == 0, res.output
    assert _lines_fit(res.output), res.output


def test_every_name_db_list_prints_is_accepted_by_db_show(filled_db):
    listed = invoke("--db", str(filled_db), "db", "list", "--limit", "3")
    names = printed_names(listed.output)
    assert RUN_A in names and RUN_B in names and len(names) == 3 + 1 + 2 + 1  # runs, link, runs, model
    for name in names:
        res = invoke("--db", str(filled_db), "db", "show", name)
        assert res.exit_code == 0, (name, res.output)


def test_run_names_round_trip_across_validate_and_db_show(filled_db, tmp_path):
    res = invoke("--db", str(filled_db), "validate", RUN_A)
    assert res.exit_code == 0 and f"run {RUN_A}" in res.output
    unique_prefix = RUN_A[:-2]
    assert f"run {RUN_A}" in invoke("--db", str(filled_db), "validate", unique_prefix).output
    shown = invoke("--db", str(filled_db), "db", "show", unique_prefix)
    assert shown.exit_code == 0 and f"run {RUN_A}" in shown.output and "3 recorded" in shown.output
    log = tmp_path / "run.jsonl"  # a log's run name (what validate prints for it) is a db show name too
    log.write_text("".join(json.dumps({"run": RUN_B, "iteration": i, "iteration_s": 1.0, "stages": {}}) + "\n"
                           for i in range(2)))
    from_log = invoke("--db", str(filled_db), "validate", str(log))
    printed = re.search(r"run (run-\S+):", from_log.output).group(1)
    assert printed == RUN_B and invoke("--db", str(filled_db), "db", "show", printed).exit_code == 0


def test_an_ambiguous_or_unknown_name_is_refused_with_exit_2(filled_db):
    both = invoke("--db", str(filled_db), "db", "show", RUN_A[:20], columns=200)
    assert both.exit_code == 2 and "matches 2 things" in both.output
    assert invoke("--db", str(filled_db), "validate", RUN_A[:20]).exit_code == 2
    nothing = invoke("--db", str(filled_db), "db", "show", "no-such-run")
    assert nothing.exit_code == 2 and "names no" in nothing.output


def test_db_show_summarises_a_cost_model_and_json_gives_the_raw_form(filled_db):
    with ProfileDB(filled_db, readonly=True) as db:
        model = db.cost_models().iloc[0]
    res = invoke("--db", str(filled_db), "db", "show", model["id"][:8])
    assert res.exit_code == 0
    assert len(res.output.splitlines()) < 40
    assert re.search(r"created: \d{4}-\d\d-\d\d \d\d:\d\d", res.output)
    assert str(int(model["created"])) not in res.output  # no raw epoch
    assert re.search(r"train mape: [\d.]+%", res.output) and "analytical mape:" in res.output
    raw = json.loads(invoke("--db", str(filled_db), "db", "show", model["id"][:8], "--json").output)
    assert raw["id"] == model["id"] and isinstance(raw["params"]["points"], list)


def test_db_show_of_a_benchmark_run_puts_shared_fields_on_one_line(filled_db):
    with ProfileDB(filled_db, readonly=True) as db:
        run = db.runs("task.decode").iloc[0]
    res = invoke("--db", str(filled_db), "db", "show", run["id"][:10])
    assert res.exit_code == 0 and _lines_fit(res.output), res.output
    assert "every sample:" in res.output and "samples (8 of 8)" in res.output
    raw = json.loads(invoke("--db", str(filled_db), "db", "show", run["id"][:10], "--json").output)
    assert raw["benchmark"] == "task.decode" and raw["created"] == run["created"]
    assert [s["seq"] for s in raw["samples"]] == list(range(8)) and "seconds" in raw["samples"][0]["metrics"]


READ_ONLY = [["db", "info"], ["db", "list"], ["db", "show", "abc"], ["db", "export", "out.hetprof"], ["fit"],
             ["validate", "run-0a1b"]]


@pytest.mark.parametrize("args", READ_ONLY, ids=lambda a: " ".join(a))
def test_read_only_commands_never_create_a_database(tmp_path, args):
    typo = tmp_path / "typo.db"
    res = invoke("--db", str(typo), *args)
    assert res.exit_code == 2, res.output
    assert str(typo) in " ".join(res.output.split())
    assert not typo.exists() and not list(tmp_path.glob("typo.db*"))


@pytest.mark.parametrize("args", [["db", "import", "missing.hetprof.gz"], ["db", "merge", "missing.db"],
                                  ["db", "import-reference", "no-such-profile"]], ids=lambda a: " ".join(a[:2]))
def test_a_missing_source_is_refused_before_the_database_is_created(tmp_path, args):
    target = tmp_path / "new.db"
    res = invoke("--db", str(target), *args)
    assert res.exit_code == 2 and args[-1] in res.output
    assert not target.exists()


def test_validate_of_a_missing_log_file_exits_2_naming_it(tmp_path):
    res = invoke("validate", str(tmp_path / "missing.jsonl"))
    assert res.exit_code == 2 and "missing.jsonl: no such run log file" in res.output


@pytest.fixture
def specs(tmp_path):
    """The planner CLI tests' two-region cluster and tiny GRPO workload, as files."""
    return [write(tmp_path, "cluster.yaml", CLUSTER), write(tmp_path, "workload.yaml", WORKLOAD)]


def test_plan_with_a_fitted_cost_model_and_no_database_exits_2_and_creates_none(tmp_path, specs):
    typo = tmp_path / "typo.db"
    res = invoke("--db", str(typo), "plan", "-c", specs[0], "-w", specs[1], "--cost-model", "fitted")
    assert res.exit_code == 2 and f"{typo}: no such profile database" in " ".join(res.output.split())
    assert not typo.exists()
    plain = invoke("--db", str(typo), "plan", "-c", specs[0], "-w", specs[1], "--max-evals", "5", columns=200)
    assert plain.exit_code == 0 and "datasheet" in plain.output and not typo.exists()  # analytical needs none


def test_an_infeasible_budget_names_the_budget_and_the_cheapest_feasible_price(specs):
    res = invoke("plan", "-c", specs[0], "-w", specs[1], "--objective", "throughput-under-budget",
                 "--budget", "0.05", "--max-evals", "10", columns=300)
    assert res.exit_code == 3, res.output
    found = re.search(r"no plan within --budget \$0\.05/h: the cheapest feasible plan it scored costs \$([\d.]+)/h",
                      res.output)
    assert found, res.output
    cheapest = float(found.group(1))
    assert cheapest > 0.05
    ok = invoke("plan", "-c", specs[0], "-w", specs[1], "--objective", "throughput-under-budget",
                "--budget", str(cheapest + 0.01), "--max-evals", "10", columns=300)
    assert ok.exit_code == 0, ok.output  # the figure named is one a plan really meets


def test_several_searches_over_budget_name_the_budget_and_the_cheapest_figure_once():
    from hetprof.planner.cli import _no_plan
    from hetprof.planner.report import Outcome
    from hetprof.planner.session import PlanOptions

    options = PlanOptions(objective="throughput-under-budget", budget=1.0)
    over = [Outcome(name, None, None, error=f"search {name!r} found no plan within --budget",
                    extra={"cheapest_per_hour": price}) for name, price in (("verl", 76.0), ("hetrl", 5.6))]
    assert _no_plan(over, options, "w on c") == ("no plan for w on c within --budget $1.00/h: the cheapest "
                                                 "feasible plan scored costs $5.60/h (hetrl; 2 searches)")
    other = [*over, Outcome("streamrl", None, None, error="no two disjoint single-region pools")]
    assert _no_plan(other, options, "w on c").startswith("no feasible plan for w on c: verl: search 'verl'")


def test_the_search_comparison_fits_a_narrow_terminal_and_names_each_cheapest_price():
    from hetprof.planner.report import Outcome, print_comparison

    console = Console(width=NARROW, file=None)
    rows = [Outcome(name, None, None, 0.4, error=f"search {name!r} found no plan within --budget $0.05/h: …",
                    extra={"cheapest_per_hour": price, "evaluations": 30})
            for name, price in (("arealhex", 4.0), ("exhaustive", 1.3))]
    with console.capture() as out:
        print_comparison(console, rows, title="tiny-grpo on duo")
    assert _lines_fit(out.get()), out.get()
    flat = " ".join(out.get().split())
    assert "$1.30/h" in flat and "$4.00/h" in flat and "exhaustive" in flat and "not shown at this width" in flat
    assert "found no plan" not in flat  # the figure, not each search's whole sentence


def test_a_device_summary_names_its_memory(db_path):
    with ProfileDB(db_path) as db:
        dev = db.add_device(DeviceInfo(name="gpu0", kind="cuda", catalog_type="L4", host="h", memory_bytes=24 << 30))
    res = invoke("--db", str(db_path), "db", "show", dev[:8])
    assert res.exit_code == 0 and "memory: 24.0 GiB" in res.output


def test_the_plan_report_fits_a_narrow_terminal_with_task_names_whole(specs):
    res = invoke("plan", "-c", specs[0], "-w", specs[1], "--max-evals", "20")
    assert res.exit_code == 0, res.output
    assert _lines_fit(res.output), res.output
    assert all(re.search(rf"│ {task}\s", res.output) for task in ("actor_gen", "ref_infer", "actor_train"))
    assert "not shown at this width:" in " ".join(res.output.split())


def test_the_ids_fit_prints_are_accepted_by_db_show(db_path):
    with ProfileDB(db_path) as db:
        add_rows(db, models=("tiny", "tiny-2x"), batches=(1, 4), lengths=(16, 128), repeats=2)
    res = invoke("--db", str(db_path), "fit")
    ids = re.findall(r"│ ([0-9a-f]{8}) │$", res.output, re.M)
    assert len(ids) == 3, res.output  # prefill, decode, train on the one device, id kept at any width
    for model_id in ids:
        shown = invoke("--db", str(db_path), "db", "show", model_id)
        assert shown.exit_code == 0 and f"cost model {model_id}" in shown.output.replace("\n", "")


def test_the_fallback_warning_names_partly_and_wholly_uncovered_types_in_one_line():
    from types import SimpleNamespace

    from hetprof.costmodels.features import TASK_PHASE
    from hetprof.planner.provenance import fitted_warnings

    tasks = sorted(TASK_PHASE)
    fitted = {"A100-40GB": tasks, "L40S": tasks[1:], "L4": []}
    sources = {"A100-40GB": "measured", "L40S": "reference", "L4": "datasheet"}
    analytical = SimpleNamespace(inputs=lambda t: dict.fromkeys(("compute", "memory", "link"), sources[t]))
    sim = SimpleNamespace(devices={i: SimpleNamespace(type=t) for i, t in enumerate(fitted)},
                          cost_model=SimpleNamespace(fitted_tasks=fitted.__getitem__, analytical=analytical))
    [line] = fitted_warnings(sim)
    assert line.startswith(f"--cost-model fitted has no fitted models for L4; no fitted {tasks[0]} model for L40S:")
    assert "fall back to the analytical model on datasheet numbers for L4; reference numbers for L40S" in line
    assert "A100-40GB" not in line


def test_read_only_commands_leave_an_old_database_unmigrated_and_say_what_migrates_it(tmp_path):
    import sqlite3

    from helpers.old_databases import v3_database

    old = tmp_path / "old.db"
    v3_database(old)
    res = invoke("--db", str(old), "db", "info", columns=200)
    assert res.exit_code == 2 and "schema version 3 needs migrating" in res.output and "`hetprof fit`" in res.output
    conn = sqlite3.connect(old)
    assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("3",)
    conn.close()


def test_db_show_keeps_a_narrow_runs_measurements_and_drops_its_last_varying_parameters(db_path):
    shapes = [{"m": 2 ** i, "n": 3 ** i, "k": 5 ** i, "layout": f"tile-{i}" * 3, "dtype": "bf16"} for i in range(4)]
    with ProfileDB(db_path) as db:
        run = db.add_benchmark("compute.matmul", None, "h", {}, [
            {"params": p, "metrics": {"seconds": 1e-3 * (i + 1), "tflops": 12.5 * (i + 1)}} for i, p in enumerate(shapes)])
    res = invoke("--db", str(db_path), "db", "show", run[:10], columns=48)
    assert res.exit_code == 0 and _lines_fit(res.output, 48), res.output
    header = next(line for line in res.output.splitlines() if "seq" in line)
    assert all(name in header for name in ("seq", "m", "seconds", "tflops")) and "layout" not in header
    assert "every sample: dtype=bf16" in res.output and "not shown at this width:" in res.output
