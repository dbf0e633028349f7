"""The generic registry every pluggable family uses: registrations, lazy built-ins, entry points, errors."""

from __future__ import annotations

import sys
import textwrap
from importlib.metadata import EntryPoint

import pytest

from hetprof import registry
from hetprof.errors import HetprofError, SpecError
from hetprof.registry import Registry, UnknownName, subclass_of

GROUP = "hetprof.test-widgets"


class Widget:
    name = ""


class Gear(Widget):
    pass


@pytest.fixture
def widgets() -> Registry[type[Widget]]:
    return Registry("widget", GROUP, check=subclass_of(Widget), expected="a Widget subclass", name_attr="name")


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A throwaway module `widget_plugin` on sys.path, for built-ins and entry points to point at."""
    (tmp_path / "widget_plugin.py").write_text(textwrap.dedent("""
        from test_registry import Widget

        class Sprocket(Widget):
            pass

        NOT_A_WIDGET = 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "widget_plugin"
    sys.modules.pop("widget_plugin", None)


def fake_entry_points(monkeypatch, *eps: EntryPoint) -> None:
    monkeypatch.setattr(registry, "entry_points", lambda group: [ep for ep in eps if ep.group == group])


def test_register_directly_and_as_a_decorator(widgets):
    assert widgets.register("gear", Gear) is Gear and Gear.name == "gear"

    @widgets.register("cog")
    class Cog(Widget):
        pass

    assert widgets.get("gear") is Gear and widgets.get("cog") is Cog and Cog.name == "cog"
    assert widgets.names() == ["cog", "gear"] and "cog" in widgets and "belt" not in widgets
    with pytest.raises(TypeError, match="widget 'bad' must be a Widget subclass"):
        widgets.register("bad", object)
    with pytest.raises(ValueError, match="non-empty name"):
        widgets.register("", Gear)


def test_builtins_are_imported_only_when_asked_for(widgets, plugin):
    widgets.builtins["sprocket"] = f"{plugin}:Sprocket"
    assert "sprocket" in widgets.names() and plugin not in sys.modules
    assert widgets.get("sprocket").__name__ == "Sprocket" and plugin in sys.modules


def test_a_builtin_module_that_registers_itself(tmp_path, monkeypatch, widgets):
    (tmp_path / "self_registering.py").write_text("import test_registry as t\n"
                                                  "t.SELF.register('chain', type('Chain', (t.Widget,), {}))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys.modules[__name__], "SELF", widgets, raising=False)
    widgets.builtins.update(chain="self_registering", ghost="self_registering")
    try:
        assert widgets.get("chain").name == "chain"
        with pytest.raises(HetprofError, match="did not register"):
            widgets.get("ghost")
    finally:
        sys.modules.pop("self_registering", None)


def test_entry_points_are_found_checked_and_named(monkeypatch, widgets, plugin):
    good = EntryPoint(name="sprocket", value=f"{plugin}:Sprocket", group=GROUP)
    fake_entry_points(monkeypatch, good, EntryPoint(name="other", value=f"{plugin}:Sprocket", group="elsewhere"))
    assert widgets.names() == ["sprocket"]
    assert widgets.get("sprocket").name == "sprocket"
    assert list(widgets.items()) == ["sprocket"]

    widgets.register("sprocket", Gear)  # a registration wins over an entry point
    assert widgets.get("sprocket") is Gear


def test_a_bad_entry_point_is_refused_naming_the_kind(monkeypatch, widgets, plugin):
    fake_entry_points(monkeypatch, EntryPoint(name="three", value=f"{plugin}:NOT_A_WIDGET", group=GROUP),
                      EntryPoint(name="gone", value="no_such_module_xyz:W", group=GROUP))
    with pytest.raises(SpecError, match=r"entry point widget_plugin:NOT_A_WIDGET.*'widget'.*Widget subclass"):
        widgets.get("three")
    with pytest.raises(HetprofError, match="widget 'gone'.*no_such_module_xyz"):
        widgets.get("gone")


def test_adapt_turns_what_an_entry_point_yields_into_an_entry(monkeypatch, plugin):
    wrapped = Registry("widget", GROUP, adapt=lambda name, obj: (name, obj))
    fake_entry_points(monkeypatch, EntryPoint(name="sprocket", value=f"{plugin}:Sprocket", group=GROUP))
    name, cls = wrapped.get("sprocket")
    assert name == "sprocket" and cls.__name__ == "Sprocket"


def test_unknown_name_lists_what_is_available(monkeypatch, widgets, plugin):
    widgets.register("gear", Gear)
    widgets.builtins["sprocket"] = f"{plugin}:Sprocket"
    fake_entry_points(monkeypatch, EntryPoint(name="belt", value=f"{plugin}:Sprocket", group=GROUP))
    with pytest.raises(UnknownName, match="unknown widget 'chain'; expected one of belt, gear, sprocket") as err:
        widgets.get("chain")
    assert isinstance(err.value, SpecError) and err.value.field == "widget" and err.value.got == "chain"
    assert plugin not in sys.modules  # listing the names imported no built-in


def test_items_keep_registration_order(widgets):
    for name in ("b", "a", "c"):
        widgets.register(name, type(name.upper(), (Widget,), {}))
    assert list(widgets.items()) == ["b", "a", "c"]
