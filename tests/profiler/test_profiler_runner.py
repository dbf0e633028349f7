"""The runner: device suites in worker processes (the --all-gpus path) report progress and land rows."""

from __future__ import annotations

from hetprof.profiler import registry
from hetprof.profiler.runner import ProfileOptions, _parallel_devices, run_profile
from hetprof.profiles import ProfileDB


def test_worker_process_path_reports_progress_and_writes(tmp_path):
    opts = ProfileOptions(db_path=tmp_path / "p.db", suites=["inventory", "compute"], quick=True,
                          host="w")
    bars: dict[str, list] = {}

    def progress(label, total):
        bars[label] = [total, 0]

        def advance(n=1):
            bars[label][1] += n

        return advance

    summary = _parallel_devices(opts, registry.suites_to_run(opts.suites), ["cpu"], progress, lambda text: None)
    assert {r.benchmark for r in summary} == {"inventory.device", "compute.matmul"}
    assert bars["compute (cpu)"][0] == bars["compute (cpu)"][1] > 0
    with ProfileDB(opts.db_path) as db:
        assert set(db.samples()["benchmark"]) == {"inventory.device", "compute.matmul"}
        assert list(db.devices()["host"]) == ["w"]


def test_run_profile_files_host_suites_under_the_device(tmp_path):
    opts = ProfileOptions(db_path=tmp_path / "p.db", suites=["inventory"], quick=True, host="h")
    summary = run_profile(opts)
    assert [r.benchmark for r in summary] == ["inventory.device"]
    with ProfileDB(opts.db_path) as db:
        df = db.samples("inventory.")
        assert df["device_id"].notna().all() and set(df["catalog_type"]) == {"cpu"}
