"""The registry: built-ins by name, runtime registrations, entry points, and clear errors."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from hetprof.costmodels import (
    CostModel,
    LinkSpec,
    PhaseTime,
    Placement,
    Work,
    get_cost_model,
    register_cost_model,
    registry,
)
from hetprof.errors import HetprofError
from hetprof.specs.models import PRESETS


class Constant(CostModel):
    """Every phase takes one millisecond: a third party's model in six lines."""

    name = "constant"

    def __init__(self, db=None, ms: float = 1.0):
        super().__init__()
        self.ms = ms

    def phase_time(self, phase, device_type):
        return PhaseTime(self.ms / 1e3, "measured")

    def device_link(self, device_type):
        return LinkSpec(1e-5, 1e10), "datasheet"


def test_builtins_and_registration(monkeypatch):
    monkeypatch.setattr(registry, "_registered", {})
    assert {"analytical", "fitted"} <= set(registry.available_cost_models())
    register_cost_model("constant", Constant)
    cm = get_cost_model("constant", ms=2.0)
    w = Work("inference", PRESETS["tiny"], 2, 8, 8)
    assert cm.task_time(w, Placement("cpu")).seconds == pytest.approx(2e-3)
    assert "constant" in registry.available_cost_models()

    @register_cost_model("decorated")
    class Decorated(Constant):
        pass

    assert isinstance(get_cost_model("decorated"), Decorated)


def test_entry_points_are_found(monkeypatch):
    ep = EntryPoint(name="third-party", value="test_costmodels_registry:Constant", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [ep] if group == registry.ENTRY_POINT_GROUP else [])
    assert "third-party" in registry.available_cost_models()
    assert isinstance(get_cost_model("third-party"), Constant)
    broken = EntryPoint(name="broken", value="no_such_module_xyz:Model", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [broken])
    with pytest.raises(HetprofError, match="broken.*no_such_module_xyz"):
        get_cost_model("broken")


def test_unknown_name_lists_what_exists():
    with pytest.raises(HetprofError, match="unknown cost model 'nope'.*analytical.*fitted"):
        get_cost_model("nope")


def test_bad_questions_are_refused_with_the_field():
    tiny = PRESETS["tiny"]
    with pytest.raises(ValueError, match="Work.batch"):
        Work("inference", tiny, 0, 8, 8)
    with pytest.raises(ValueError, match="Work.kind"):
        Work("sleeping", tiny, 1, 8, 8)
    with pytest.raises(ValueError, match="device_type must name"):
        Placement("")
    # whether a type exists is the cost model's catalog's answer (it may extend the built-in one)
    with pytest.raises(KeyError, match="Z80"):
        get_cost_model("analytical").task_time(Work("inference", tiny, 1, 8, 8), Placement("Z80"))
    with pytest.raises(ValueError, match="beta_Bps"):
        LinkSpec(1e-3, 0.0)
