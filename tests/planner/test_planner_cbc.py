"""The CBC command the MILP searches use: serial, and it solves a small MILP."""

import pulp
import pytest

from hetprof.planner.search.cbc import cbc


def test_cbc_refuses_a_threads_option_because_the_threaded_path_stalls():
    with pytest.raises(ValueError, match="serial"):
        cbc(msg=False, threads=1)


def test_cbc_solves_a_small_choice_milp_to_optimality():
    prob = pulp.LpProblem("choice", pulp.LpMaximize)
    z = [pulp.LpVariable(f"z{i}", cat="Binary") for i in range(2)]
    n = [pulp.LpVariable("a", 0, 2, cat="Integer"), pulp.LpVariable("b", 0, 1, cat="Integer")]
    prob += 6.25 * n[0] + 15.62 * n[1]
    prob += z[0] + z[1] == 1
    prob += n[0] <= 2 * z[0]
    prob += n[1] <= z[1]
    prob.solve(cbc(msg=False, timeLimit=10))
    assert pulp.LpStatus[prob.status] == "Optimal"
    assert (n[0].value(), n[1].value()) == (0, 1)
