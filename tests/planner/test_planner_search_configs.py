"""Typed per-search configs: wrong knobs fail at once, naming themselves."""

from __future__ import annotations

import pytest
from test_planner_search_properties import small_sim

from hetprof.errors import SpecError
from hetprof.planner.search import SearchContext, get_search
from hetprof.planner.search.exhaustive import ExhaustiveConfig
from hetprof.planner.search.hetrl import HetRLConfig
from hetprof.planner.search.ilp import ILPConfig


def test_config_from_plain_data_and_its_help():
    cfg = ILPConfig.from_dict({"shortlist": 2, "time_limit_s": 3.5})
    assert cfg.shortlist == 2 and cfg.time_limit_s == 3.5 and cfg.max_nodes is None
    assert "node limit" in ILPConfig.describe()["max_nodes"]
    assert set(HetRLConfig.describe()) >= {"enumerate_limit", "milp_arms"}


def test_unknown_or_out_of_range_knobs_are_refused_by_name():
    with pytest.raises(SpecError, match="'shortlst'.*shortlist"):
        ILPConfig.from_dict({"shortlst": 2})
    with pytest.raises(SpecError, match="'shortlist'"):
        ILPConfig(shortlist=0)
    with pytest.raises(SpecError, match="'max_candidates'"):
        ExhaustiveConfig(max_candidates=0)


def test_a_search_refuses_another_searchs_config():
    ctx = SearchContext(planning=small_sim().planning, config=ILPConfig())
    with pytest.raises(SpecError, match="HetRLConfig"):
        get_search("hetrl")(ctx)
    assert isinstance(get_search("hetrl")(SearchContext(planning=small_sim().planning)).config, HetRLConfig)


@pytest.mark.parametrize("url", ["notaurl", "nosuchdriver://x/y", "sqlite:////nonexistent-dir/sub/study.db"])
def test_a_storage_url_that_cannot_be_opened_is_refused_by_name(url):
    with pytest.raises(SpecError, match="'storage'"):
        get_search("hetrl")(SearchContext(planning=small_sim().planning, max_evals=10, storage=url)).run()
