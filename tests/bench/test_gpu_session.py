"""The GPU session (bench/gpu_session.py) on the CPU: its dry run end to end, the per-step time caps,
and the kit's one-line refusals (a missing package, a version pyproject refuses, stale sources)."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from helpers.bench_modules import BENCH, load_bench

gpu_kit = load_bench("gpu_kit")
gpu_report = load_bench("gpu_report")
gpu_session = load_bench("gpu_session")


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel(folder: Path, name: str, files: dict[str, bytes], version: str = "1.0") -> Path:
    """A minimal valid pure-Python wheel holding `files`."""
    info = f"{name}-{version}.dist-info"
    members = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
               f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},{_hash(d)},{len(d)}\n" for p, d in members.items()) + f"{info}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in {**members, f"{info}/RECORD": record.encode()}.items():
            z.writestr(p, d)
    return path


def _session(tmp_path: Path) -> object:
    log = tmp_path / "session.log"
    log.write_text("")
    return gpu_session.Session(tmp_path, tmp_path, dict(__import__("os").environ), log)


@pytest.mark.slow
def test_dry_run_measures_plans_runs_and_reports(tmp_path):
    """`--device cpu --quick --no-kit`: every step but the copy suite runs (tiny model, 2 iterations),
    and the report holds the matmul rows and measured against predicted per task and iteration."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(BENCH / "gpu_session.py"), "--device", "cpu", "--quick", "--no-kit",
                           "--out", str(out), "--scratch", str(tmp_path / "scratch")],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"plan.json", "run.jsonl", "report.md", "report.json", "session.log"} <= set(files)
    assert any(f.endswith(".hetprof.gz") and (out / f).stat().st_size > 0 for f in files)
    report = json.loads((out / "report.json").read_text())
    status = {s["name"]: s["status"] for s in report["steps"]}
    assert status.pop("memory") == "not run" and set(status.values()) == {"ok"}, status
    assert [r["dtype"] for r in report["matmul"]] == ["fp32"] and report["matmul"][0]["best_tflops"] > 0
    per_task = report["run"]["predicted_vs_measured"]
    assert per_task["iteration"]["measured"] > 0 and per_task["iteration"]["predicted"] > 0
    assert per_task["actor_train"]["ratio"] is not None
    assert {r["task"] for r in report["tasks"]} == {"prefill", "decode", "train", "generate"}
    assert "measured / predicted" in (out / "report.md").read_text()


def test_a_step_past_its_cap_is_cut_and_the_rest_still_runs(tmp_path):
    """The cut stops the step's whole process group (a grandchild too); a failed step keeps its
    output's last lines; a step needing a cut one is skipped."""
    pid_file = tmp_path / "grandchild.pid"
    slow = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
            f" open({str(pid_file)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(60)")
    steps = [
        gpu_session.Step("slow", 2.0, lambda s: s.command([sys.executable, "-c", slow])),
        gpu_session.Step("fails", 30.0, lambda s: s.command([sys.executable, "-c", "print('boom'); raise SystemExit(3)"])),
        gpu_session.Step("after", 30.0, lambda s: s.command([sys.executable, "-c", "print('ran')"])),
        gpu_session.Step("needs-slow", 30.0, lambda s: s.command([sys.executable, "-c", "pass"]), needs=("slow",)),
    ]
    results = {r.name: r for r in gpu_session.run_steps(_session(tmp_path), steps, budget_s=120)}
    assert results["slow"].status == "timed out" and "started" in results["slow"].tail
    assert results["fails"].status == "failed" and "boom" in results["fails"].tail
    assert results["after"].status == "ok"
    assert results["needs-slow"].status == "skipped" and "slow" in results["needs-slow"].why
    grandchild = Path(f"/proc/{pid_file.read_text()}/status")
    assert not grandchild.exists() or "zombie" in grandchild.read_text()  # reaped, or dead and unreaped


def test_steps_past_the_budget_are_skipped_but_the_final_ones_run(tmp_path):
    ran = []
    steps = [gpu_session.Step("one", 30.0, lambda s: ran.append("one")),
             gpu_session.Step("report", 30.0, lambda s: ran.append("report"), final=True)]
    results = gpu_session.run_steps(_session(tmp_path), steps, budget_s=10.0)  # less than the final caps
    assert [r.status for r in results] == ["skipped", "ok"] and ran == ["report"]
    assert "budget" in results[0].why


def test_a_missing_kit_package_is_one_line_naming_it(tmp_path):
    kit = tmp_path / "kit"
    kit.mkdir()
    for name in ("optuna", "hetprof"):
        _wheel(kit, name, {f"{name}/__init__.py": b""})
    with pytest.raises(gpu_kit.KitError) as err:
        gpu_kit.wheels_needed(kit)
    assert "colorlog" in str(err.value) and "\n" not in str(err.value)
    out = tmp_path / "out"
    rc = gpu_session.main(["--device", "cpu", "--quick", "--kit", str(kit), "--out", str(out),
                           "--scratch", str(tmp_path / "scratch")])
    report = json.loads((out / "report.json").read_text())
    kit_step = report["steps"][0]
    assert rc == 1 and kit_step["status"] == "failed" and "colorlog" in kit_step["why"]
    assert "\n" not in kit_step["why"]
    assert {s["status"] for s in report["steps"][1:]} <= {"skipped", "not run"}


def test_the_kit_installs_into_a_private_folder(tmp_path):
    kit = tmp_path / "kit"
    kit.mkdir()
    for name in [*gpu_kit.KIT, gpu_kit.PROJECT]:
        _wheel(kit, name, {f"{name}_probe/__init__.py": b"X = 1\n"})
    _wheel(kit, "unrelated", {"unrelated/__init__.py": b""})  # in the folder, not the session's: not installed
    assert "pip install" in gpu_kit.install(kit, tmp_path / "site")
    found = {d.metadata["Name"] for d in metadata.distributions(path=[str(tmp_path / "site")])}
    assert found == {*gpu_kit.KIT, gpu_kit.PROJECT}


def test_the_kit_installs_without_pip_too(tmp_path, monkeypatch):
    kit = tmp_path / "kit"
    kit.mkdir()
    for name in [*gpu_kit.KIT, gpu_kit.PROJECT]:
        _wheel(kit, name, {f"{name}_probe/__init__.py": b"X = 1\n"})
    real_run = subprocess.run
    monkeypatch.setattr(gpu_kit.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1)
                        if cmd[1:4] == ["-m", "pip", "--version"] else real_run(cmd, **kw))
    assert "unzipped" in gpu_kit.install(kit, tmp_path / "site")
    found = {d.metadata["Name"] for d in metadata.distributions(path=[str(tmp_path / "site")])}
    assert found == {*gpu_kit.KIT, gpu_kit.PROJECT}


def test_versions_are_checked_against_pyproject(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["numpy<1", "pulp>=2.8"]\n')
    with pytest.raises(gpu_kit.KitError) as err:
        gpu_kit.check_versions(pyproject, sys.path)
    assert "numpy" in str(err.value) and "<1" in str(err.value) and "\n" not in str(err.value)
    pyproject.write_text('[project]\ndependencies = ["pulp>=2.8", "torch>=2"]\n')
    with pytest.raises(gpu_kit.KitError, match="torch"):  # needed, and nowhere on this (empty) path
        gpu_kit.check_versions(pyproject, [])
    pyproject.write_text('[project]\ndependencies = ["numpy>=1", "pulp>=2.8"]\n')
    rows = {r["package"]: r for r in gpu_kit.check_versions(pyproject, sys.path)}
    assert rows["numpy"]["found"] and rows["optuna"]["note"] == "kit package"


def test_pulp_may_be_absent_but_a_kit_package_may_not(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["pulp>=2.8"]\n')
    site = tmp_path / "site"
    for name in gpu_kit.KIT:
        with zipfile.ZipFile(_wheel(tmp_path, name, {f"{name}/__init__.py": b""})) as z:
            z.extractall(site)
    rows = {r["package"]: r for r in gpu_kit.check_versions(pyproject, [str(site)])}
    assert rows["pulp"]["found"] is None and rows["pulp"]["note"].startswith("absent")
    for info in site.glob("colorlog-*.dist-info"):
        for f in info.iterdir():
            f.unlink()
        info.rmdir()
    with pytest.raises(gpu_kit.KitError, match="colorlog"):
        gpu_kit.check_versions(pyproject, [str(site)])


def test_a_kit_built_before_an_edit_is_stale(tmp_path):
    repo = tmp_path / "repo"
    (repo / "hetprof").mkdir(parents=True)
    (repo / "profiler").mkdir()
    (repo / "pyproject.toml").write_text('[tool.setuptools]\npackage-dir = {"hetprof" = "hetprof", '
                                         '"hetprof.profiler" = "profiler"}\npackages = ["hetprof", "hetprof.profiler"]\n')
    files = {"hetprof/a.py": b"A = 1\n", "hetprof/profiler/b.py": b"B = 1\n"}
    (repo / "hetprof" / "a.py").write_bytes(files["hetprof/a.py"])
    (repo / "profiler" / "b.py").write_bytes(b"B = 2\n")  # edited after the wheel was built
    (repo / "profiler" / "new.py").write_bytes(b"")  # added after
    kit = tmp_path / "kit"
    kit.mkdir()
    with zipfile.ZipFile(_wheel(kit, "hetprof", files)) as z:
        z.extractall(tmp_path / "site")
    dist = next(iter(metadata.distributions(name="hetprof", path=[str(tmp_path / "site")])))
    assert gpu_kit.stale_sources(dist, repo, repo / "pyproject.toml") == ["profiler/b.py", "profiler/new.py"]


def test_kit_plus_project_over_the_limit_is_refused(tmp_path):
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "big.whl").write_bytes(b"\0" * 2**20)
    project = gpu_kit.travelling_bytes(gpu_kit.ROOT, tmp_path / "none")
    assert gpu_kit.travelling_bytes(gpu_kit.ROOT, kit) == project + 2**20
    with pytest.raises(gpu_kit.KitError, match="MiB"):
        gpu_kit.check_size(gpu_kit.ROOT, kit, limit_mib=project / 2**20)


def test_the_gpu_session_plans_the_job_before_the_larger_models_and_fits_8_minutes(tmp_path):
    args = gpu_session.parse(["--out", str(tmp_path)])
    names = [s.name for s in gpu_session.steps_for(args, gpu_session.SCALES["full"])]
    assert names == ["kit", "inventory", "compute", "memory", "tasks-qwen3-0.6b", "fit", "plan", "run", "validate",
                     "tasks-qwen3-1.7b", "tasks-qwen3-4b", "tasks-qwen3-8b", "export", "summary"]
    assert not any(s.skip for s in gpu_session.steps_for(args, gpu_session.SCALES["full"]))  # memory runs on a GPU
    assert args.budget_s <= 8 * 60
