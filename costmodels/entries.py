"""What every fitted cost model stored in the database holds, checked before anything is computed.

Entries may come from strangers' databases (`hetprof db import`), so each part is read as plain data:
the device type must be one the catalog knows, the dtype one the cost model prices, the features the
ones this version computes, and the model parameters of the named family's shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hetprof.costmodels.families import Family, get_family
from hetprof.specs.catalog import canonical_name
from hetprof.specs.models import DTYPE_BYTES


def checked_parts(params: dict[str, Any], features: Sequence[str],
                  row: dict[str, Any] | None = None) -> tuple[str, str, Family, dict[str, Any]]:
    """(device type, dtype, family, model parameters) of an entry's `params`, or ValueError naming
    what is wrong; where the entry's `row` names its family too, the two must agree."""
    device = params.get("device_type")
    device = canonical_name(device) if isinstance(device, str) else None
    if device is None:
        raise ValueError("device_type is not a catalog device type")
    dtype = params.get("dtype")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}")
    if params.get("features") != list(features):
        raise ValueError("fitted on other features than this version computes")
    family = get_family(params.get("family"))
    if row is not None and row.get("family") != family.name:
        raise ValueError("family disagrees with the row's family")
    model = params.get("model")
    if not isinstance(model, dict):
        raise ValueError("model is not an object")
    family.check(model, len(features))
    return device, dtype, family, model
