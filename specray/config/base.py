"""What every section of a sweep spec shares: frozen models that forbid unknown keys, and the
value types of its fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

# τ is a softmax temperature; 0 means greedy. Above 5 a 32k-vocab softmax is near uniform, so a larger
# value is almost certainly a typo (the paper's out-of-range study stops at 2.0).
MAX_TEMPERATURE = 5.0


Temperature = Annotated[float, Field(ge=0.0, le=MAX_TEMPERATURE)]


Paradigm = Literal["offline", "online"]


Divergence = Literal["fkl", "rkl", "jsd", "tvd"]


Estimator = Literal["analytic", "empirical"]


DType = Literal["auto", "float32", "bfloat16", "float16"]


LenienceFunction = Literal["lin", "sq", "exp"]  # specray/ops/lenience.py: p/ε, p/ε², p^ε


# The tags of a field that takes one value or a list (`distill.divergence`): they pick the member, and
# error paths leave them out (`config/loading.py`), so an error reads `distill.divergence.1: ...`.
ONE_TAG = "one_value"
LIST_TAG = "value_list"


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_Number = TypeVar("_Number", int, float)


def unique_sorted(values: Sequence[_Number], field: str) -> list[_Number]:
    if len(set(values)) != len(values):
        raise ValueError(f"{field} has duplicates: {list(values)}")
    return sorted(values)
