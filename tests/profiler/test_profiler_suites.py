"""Device suites on the CPU: numbers agree with plain torch timed side by side; no NVML needed."""

from __future__ import annotations

import pytest
import torch

from hetprof.errors import SpecError
from hetprof.profiler import devices, hostinfo, registry
from hetprof.profiler.context import ProfileContext
from hetprof.profiler.suites.compute import ComputeSuite, dtypes_for, fp8_matmul
from hetprof.profiler.suites.inventory import InventorySuite
from hetprof.profiler.suites.memory import MemorySuite, sizes_for
from hetprof.profiles import ProfileDB


def _ctx(db, device_id=None, **kw) -> ProfileContext:
    return ProfileContext(db=db, host="t", device="cpu", device_id=device_id, quick=True, threads=1,
                          devices=["cpu"], **kw)


def test_matmul_rows_carry_their_shape_rate_and_thread_count(tmp_path, one_thread):
    """How close the rate is to plain torch is a timing: bench/profiler_bench.py reports it."""
    with ProfileDB(tmp_path / "p.db") as db:
        ctx = _ctx(db)
        ComputeSuite().run(ctx)
        df = db.samples("compute.matmul")
    square = df[(df.m == 1024) & (df.n == 1024) & (df.k == 1024)]
    assert len(square) >= 3 and (square["tflops"] > 0).all()
    assert ((square["tflops"] * 1e12 * square["seconds"]).round() == 2 * 1024**3).all()
    assert set(df["dtype"]) == {"fp32"}  # fp32 only on the CPU
    assert "best" in ctx.summary[0].headline and "median" in ctx.summary[0].headline
    assert (df["threads"] == 1).all()


def test_fp8_is_timed_only_where_the_device_has_fp8_tensor_cores():
    assert dtypes_for("cpu", None) == ["fp32"]
    assert "fp8" not in dtypes_for("cuda:0", (8, 0))  # A100: no fp8 units
    assert "fp8" not in dtypes_for("cuda:0", None)
    for capability in ((8, 9), (9, 0), (10, 0)):  # Ada, Hopper, Blackwell
        assert dtypes_for("cuda:0", capability) == ["bf16", "fp16", "fp8", "fp32"]


def test_fp8_matmul_multiplies_the_e4m3_operands_into_bf16():
    """The timed call is A @ B (not B @ A or a transpose): same result as the operands dequantized."""
    call = fp8_matmul(32, 48, 64, "fp8", torch.device("cpu"))
    out = call()
    assert out.shape == (32, 48) and out.dtype == torch.bfloat16
    operands = dict(zip(call.__code__.co_freevars, (c.cell_contents for c in call.__closure__), strict=True))
    a, b = operands["a"], operands["b"]
    assert a.dtype == b.dtype == torch.float8_e4m3fn and b.stride() == (1, 64)  # B column-major
    expected = a.float() @ b.float()
    assert torch.allclose(out.float(), expected, rtol=1e-2)


def test_copy_sizes_stream_from_memory_not_from_the_last_level_cache():
    llc = hostinfo.last_level_cache_bytes()
    for quick in (True, False):
        sizes = sizes_for("cpu", quick)
        assert sizes == sorted(sizes) and sizes[0] >= 64 * 2**20
        if llc:
            assert sizes[0] >= 4 * llc


def test_copy_rows_count_read_plus_write(tmp_path, one_thread, monkeypatch):
    """The row arithmetic at small sizes (the real sizes are 4x the LLC: GBs on a large-cache CPU).
    How close the bandwidth is to plain torch is a timing: bench/profiler_bench.py reports it."""
    small = [2**20, 2**21]
    monkeypatch.setattr("hetprof.profiler.suites.memory.sizes_for", lambda device, quick: small)
    with ProfileDB(tmp_path / "p.db") as db:
        MemorySuite().run(_ctx(db))
        df = db.samples("memory.copy")
    assert set(df["size_bytes"]) == set(small) and (df["bandwidth_Bps"] > 0).all()
    assert ((df["bandwidth_Bps"] * df["seconds"]).round() == 2 * df["size_bytes"]).all()


def test_inventory_and_fingerprint_without_nvml(tmp_path, monkeypatch):
    import pynvml

    def no_library():
        raise pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    ok, why = hostinfo.nvml_status()
    assert not ok and "NVML" in why
    info = devices.describe("cpu", "t", threads=1)
    assert info.kind == "cpu" and info.catalog_type == "cpu" and info.memory_bytes > 0
    assert info.extra["cores"] >= 1 and info.extra["threads"] == 1 and "NVML" in info.extra["nvml"]
    with ProfileDB(tmp_path / "p.db") as db:
        dev = db.add_device(info)
        ctx = _ctx(db, dev)
        InventorySuite().run(ctx)
        df = db.samples("inventory.device")
    assert df.loc[0, "kind"] == "cpu" and df.loc[0, "cores"] >= 1
    assert "NVML" in ctx.summary[0].headline


def test_fingerprint_is_stable_across_runs(tmp_path):
    with ProfileDB(tmp_path / "p.db") as db:
        first = db.add_device(devices.describe("cpu", "t", 1))
        again = db.add_device(devices.describe("cpu", "t", 1))
        other = db.add_device(devices.describe("cpu", "t", 2))
    assert first == again and first != other  # thread count decides comparability on a CPU


def test_device_selection_errors_name_the_option():
    with pytest.raises(SpecError, match="--device"):
        devices.select_devices(("gpu0",), False)
    if not torch.cuda.is_available():
        with pytest.raises(SpecError, match="GPU index below 0"):
            devices.select_devices(("cuda:0",), False)
        assert devices.select_devices((), True) == ["cpu"]
    assert devices.select_devices(("cpu,cpu",), False) == ["cpu"]


def test_registry_lists_builtins_and_refuses_unknown_suites():
    names = registry.available_suites()
    assert names[:7] == ["inventory", "compute", "memory", "collectives", "tasks", "dptrain", "link"]
    assert [c.name for c in registry.suites_to_run(None)] == ["inventory", "compute", "memory", "collectives", "tasks",
                                                        "dptrain", "moe"]
    with pytest.raises(SpecError, match="--suite.*inventory"):
        registry.suites_to_run(["flops"])


def test_third_party_suites_come_from_entry_points(monkeypatch):
    class Echo(registry.Suite):
        name = "echo"

    class FakeEP:
        def __init__(self, name, obj):
            self.name, self.value, self.obj = name, f"pkg:{name}", obj

        def load(self):
            return self.obj

    monkeypatch.setattr(registry, "entry_points", lambda group: [FakeEP("echo", Echo)])
    assert registry.suites_to_run(["echo"]) == [Echo]
    monkeypatch.setattr(registry, "entry_points", lambda group: [FakeEP("bad", object)])
    with pytest.raises(SpecError, match="Suite subclass"):
        registry.available_suites()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compute_and_memory(tmp_path):
    with ProfileDB(tmp_path / "p.db") as db:
        dev = db.add_device(devices.describe("cuda:0", "t", 1))
        ctx = ProfileContext(db=db, host="t", device="cuda:0", device_id=dev, quick=True, threads=1,
                             devices=["cuda:0"])
        ComputeSuite().run(ctx)
        MemorySuite().run(ctx)
        df = db.samples("compute.matmul")
    fp8 = {"fp8"} if torch.cuda.get_device_capability(0) >= (8, 9) else set()
    assert set(df["dtype"]) == {"bf16", "fp16", "fp32"} | fp8
    assert df[df.dtype == "bf16"]["tflops"].max() > df[df.dtype == "fp32"]["tflops"].max()
