"""Cost models: seconds and bytes for a task, its layout and its devices (DESIGN §5).

`get_cost_model("analytical" | "fitted", db=...)` returns a model with `task_time`, `memory`,
`collective_time` and the transfer helpers; `Work`, `Placement` and `LinkSpec` describe the question.
"""

from hetprof.costmodels.base import CostModel
from hetprof.costmodels.data import Estimate, LinkSpec, MemoryEstimate, Phase, PhaseTime, Placement, Work
from hetprof.costmodels.registry import available_cost_models, get_cost_model, register_cost_model

__all__ = [
    "CostModel", "Estimate", "LinkSpec", "MemoryEstimate", "Phase", "PhaseTime", "Placement", "Work",
    "available_cost_models", "get_cost_model", "register_cost_model",
]
